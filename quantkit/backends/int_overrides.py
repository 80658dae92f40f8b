"""Per-layer integer schemes for the llm-compressor formats (``options.overrides``).

Each override is one more compressed-tensors config group: its ``targets`` (exact module names,
or ``re:`` regular expressions matched from the start of the name, as compressed-tensors
matches them) get their own bits, group size or symmetry; what an override leaves out it
inherits from the recipe's scheme. compressed-tensors gives a name target precedence over the
base group's class target (``Linear``) but orders two matching regular expressions
alphabetically, so a module two overrides name is refused here, as is an override that names
no quantized linear layer of the model (the library would only warn) or whose group size does
not divide a named layer's input width. Checked against the safetensors headers before the
model loads, and again on the artifact: every layer's stored bits are read back from its
packed weights.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

from quantkit.errors import BackendError, RecipeError

WHERE = "options.overrides"
_TARGET_HINT = (
    "a target is a module name (model.layers.0.mlp.down_proj) or re:<regex> matched from the start "
    r"of the name (re:.*layers\.(0|1)\.mlp\.down_proj$)"
)


class IntScheme(BaseModel):
    """An override with what it left out filled in from the recipe: one config group."""

    model_config = ConfigDict(frozen=True)

    targets: list[str]
    bits: int
    group_size: int | None
    symmetric: bool

    def matches(self, name: str) -> bool:
        """compressed-tensors' rule: ``re:`` targets ``re.match`` the name, others equal it."""
        return any(_match(target, name) for target in self.targets)

    def scheme_name(self) -> str:
        return int_scheme_name(self.bits, self.group_size, self.symmetric)

    def effective_bits(self) -> float:
        return int_effective_bits(self.bits, self.group_size, self.symmetric)


def int_scheme_name(bits: int, group_size: int | None, symmetric: bool) -> str:
    """``W4A16-g128``, ``W8A16-per-channel``, ``W4A16-g64-asym``."""
    group = f"g{group_size}" if group_size else "per-channel"
    return f"W{bits}A16-{group}{'' if symmetric else '-asym'}"


def int_effective_bits(bits: int, group_size: int | None, symmetric: bool) -> float:
    """Bits per weight including the fp16 scale (and zero point) per group."""
    if not group_size:
        return float(bits)
    return bits + (16 + (0 if symmetric else bits)) / group_size


def check_group_size(value: int, per_channel: str = "null") -> int:
    """A group size must be a power of two >= 8 (``per_channel``: how the field asks for none)."""
    if value < 8 or value & (value - 1):
        raise ValueError(f"must be a power of two >= 8 (e.g. 32, 64, 128) or {per_channel} for per-channel")
    return value


class IntOverride(BaseModel):
    """One per-layer scheme: the modules ``targets`` names get these bits / group / symmetry;
    a field left out (null) is the recipe's."""

    model_config = ConfigDict(extra="forbid")

    targets: list[str] = Field(min_length=1, description="module names, or re:<regex> from the name's start")
    bits: Literal[3, 4, 8] | None = Field(
        None, description="weight bits of these modules; null = the recipe's"
    )
    group_size: int | Literal["channel"] | None = Field(
        None, description="input columns per scale, or channel (one per output channel); null = the recipe's"
    )
    symmetric: bool | None = Field(None, description="no zero point; null = the recipe's")

    @field_validator("targets")
    @classmethod
    def _valid_targets(cls, targets: list[str]) -> list[str]:
        for target in targets:
            if not target.strip():
                raise ValueError(f"an empty target; {_TARGET_HINT}")
            if target.startswith("re:"):
                try:
                    re.compile(target.removeprefix("re:"))
                except re.error as err:
                    raise ValueError(f"'{target}' is not a regular expression ({err})") from None
            elif target[0].isupper() and "." not in target:
                raise ValueError(f"'{target}' looks like a class name: overrides name modules or re:<regex>")
        return targets

    @field_validator("group_size")
    @classmethod
    def _power_of_two(cls, value: int | str | None) -> int | str | None:
        return check_group_size(value, per_channel="channel") if isinstance(value, int) else value

    def resolved(self, bits: int, group_size: int | None, symmetric: bool) -> IntScheme:
        """This override with the fields it left out taken from the recipe's scheme."""
        group = group_size if self.group_size is None else self.group_size
        return IntScheme(
            targets=self.targets,
            bits=bits if self.bits is None else self.bits,
            group_size=None if group == "channel" else group,
            symmetric=symmetric if self.symmetric is None else self.symmetric,
        )


def _match(target: str, name: str) -> bool:
    if target.startswith("re:"):
        return re.match(target.removeprefix("re:"), name) is not None
    return target == name


def quantized_linears(shapes: Mapping[str, tuple[list[int], str]], ignore: Sequence[str]) -> dict[str, int]:
    """The decoder layers' linear modules the base scheme quantizes -> their input width, from
    the safetensors headers (2-D ``.weight`` tensors under ``.layers.``, not ignored)."""
    modules: dict[str, int] = {}
    for tensor, (shape, _) in shapes.items():
        if len(shape) != 2 or not tensor.endswith(".weight") or ".layers." not in tensor:
            continue
        name = tensor.removesuffix(".weight")
        if not any(_match(target, name) or name.endswith(f".{target}") for target in ignore):
            modules[name] = int(shape[1])
    return modules


def assign(overrides: Sequence[IntScheme], modules: Mapping[str, int]) -> dict[str, int]:
    """Module -> index of the override that names it. Refuses an override naming no module, a
    module two overrides name, and a group size that does not divide a named module's width."""
    owner: dict[str, int] = {}
    for index, override in enumerate(overrides):
        named = [name for name in modules if override.matches(name)]
        if not named:
            example = next(iter(modules), "model.layers.0.mlp.down_proj")
            raise RecipeError(
                f"{WHERE}[{index}] targets {override.targets} name no quantized linear layer of this model",
                f"name a layer such as {example} (embeddings and the output head stay unquantized); "
                + _TARGET_HINT,
            )
        for name in named:
            if name in owner:
                raise RecipeError(
                    f"{WHERE}[{owner[name]}] and {WHERE}[{index}] both name {name}",
                    "make the targets disjoint: compressed-tensors would pick one by the regexes' "
                    "alphabetical order",
                )
            owner[name] = index
            width = modules[name]
            if override.group_size and width % override.group_size:
                raise RecipeError(
                    f"{WHERE}[{index}].group_size={override.group_size} does not divide {name}'s "
                    f"input width {width}",
                    "use a group size that divides it, or null (per channel)",
                )
    return owner


def bits_per_module(
    overrides: Sequence[IntScheme], modules: Mapping[str, int], base_bits: float
) -> dict[str, float]:
    """Each quantized module's effective bits per weight (scales included)."""
    owner = assign(overrides, modules)
    return {name: overrides[owner[name]].effective_bits() if name in owner else base_bits for name in modules}


def mean_bits(bits: Mapping[str, float], shapes: Mapping[str, tuple[list[int], str]]) -> float:
    """Bits per quantized weight over ``bits``' modules, weighted by their parameter counts."""
    weights = {name: _count(shapes[f"{name}.weight"][0]) for name in bits}
    total = sum(weights.values())
    return sum(bits[name] * weights[name] for name in bits) / total if total else 0.0


def _count(shape: list[int]) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count


def check_artifact(
    artifact_shapes: Mapping[str, tuple[list[int], str]],
    source_widths: Mapping[str, int],
    expected: Mapping[str, int],
) -> None:
    """Every module stored at the bits it was meant to get: compressed-tensors packs a row's
    ``bits``-bit weights densely into int32s, ``ceil(width * bits / 32)`` of them."""
    wrong: list[str] = []
    for name, bits in expected.items():
        packed = artifact_shapes.get(f"{name}.weight_packed")
        if packed is None:
            wrong.append(f"{name} (not packed)")
            continue
        columns = int(packed[0][1])
        if columns != -(-source_widths[name] * bits // 32):  # compressed-tensors: ceil(width * bits / 32)
            wrong.append(f"{name} ({columns * 32 / source_widths[name]:g} bits, not {bits})")
    if wrong:
        raise BackendError(
            f"the artifact stores {len(wrong)} layer(s) at other bits than {WHERE} asked: "
            + ", ".join(wrong[:3]),
            "the model's module names differ from its checkpoint's tensor names; name the modules as "
            "model.named_modules() does",
        )


def overrides_record(overrides: Sequence[IntScheme], owner: Mapping[str, int]) -> list[JsonValue]:
    """What the manifest records per override: its resolved scheme and the modules it named."""
    return [
        {
            "targets": _json_list(override.targets),
            "scheme": override.scheme_name(),
            "modules": _json_list(sorted(name for name, index in owner.items() if index == position)),
        }
        for position, override in enumerate(overrides)
    ]


def _json_list(names: Sequence[str]) -> list[JsonValue]:
    return list(names)
