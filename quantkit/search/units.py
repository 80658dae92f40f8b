"""The parts of a model the search profiles and demotes (decoder layers, tensor classes, the
embedding and output) and the per-tensor proxy scores they are made of: shared by the GGUF
profile (``search.profile``) and the integer formats' (``search.int_format``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

from quantkit.errors import RecipeError

if TYPE_CHECKING:
    from quantkit.inputs.tokens import TokenWindows
    from quantkit.stages.context import Tokens

CLASSES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
EMBEDDING, OUTPUT = "token_embd.weight", "output.weight"


class TensorScore(BaseModel):
    """One quantized tensor: where it sits, its size, and the proxy error of each type."""

    name: str
    layer: int | None
    kind: str
    params: int
    width: int
    proxy: dict[str, float] = Field(
        description="E||dW x||^2 / E||h||^2 per type (calibration tokens; h: the residual stream there)"
    )


@dataclass(frozen=True)
class Unit:
    """A part of the model quantized on its own: a name, its kind, and how to ask llama.cpp."""

    name: str
    kind: Literal["layer", "class"]
    members: tuple[str, ...]

    def options(self, base: str, low: str) -> dict[str, object]:
        """GGUF recipe options that put this unit at ``low`` and the rest at ``base``."""
        options: dict[str, object] = {"type": base, "outtype": "f16"}
        if self.name == EMBEDDING:
            options["token_embedding_type"] = low
        elif self.name == OUTPUT:
            options["output_tensor_type"] = low
        elif self.kind == "layer":
            options["tensor_types"] = {rf"^blk\.{self.name.split()[-1]}\.": low}
        else:
            options["tensor_types"] = {rf"{self.name}\.weight$": low}
        return options


def units_of(tensors: Sequence[TensorScore]) -> list[Unit]:
    """Every decoder layer, then every tensor class present, the embedding and an untied output."""
    layers = sorted({t.layer for t in tensors if t.layer is not None})
    units = [Unit(f"layer {i}", "layer", tuple(t.name for t in tensors if t.layer == i)) for i in layers]
    others = sorted({t.kind for t in tensors if t.layer is not None and t.kind not in CLASSES})
    for kind in (*CLASSES, *others):
        members = tuple(t.name for t in tensors if t.kind == kind)
        if members:
            units.append(Unit(kind, "class", members))
    for name in (EMBEDDING, OUTPUT):
        if any(t.name == name for t in tensors):
            units.append(Unit(name, "class", (name,)))
    return units


def calibration_of(tokens: Tokens) -> TokenWindows:
    """The calibration windows the proxy's importance matrix is computed on."""
    windows = tokens.calibration_windows()
    if windows is None:
        raise RecipeError("the proxy needs calibration tokens", "remove 'calibration: null'")
    return windows
