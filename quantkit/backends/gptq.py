"""GPTQ: ``options.engine`` picks the implementation. This module is the llm-compressor engine
(GPTQModifier, compressed-tensors pack-quantized output) and the dispatch to the others
(``GPTQ_ENGINES``); each engine has its own typed options, and an option or a bit width only
another engine has is refused naming that engine."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from pydantic import Field, JsonValue

from quantkit.backends.base import Artifact, Backend, BackendOptions, QuantizeJob
from quantkit.backends.int_weights import IntWeightBackend, IntWeightOptions
from quantkit.errors import RecipeError
from quantkit.registry import Registry

if TYPE_CHECKING:
    from llmcompressor.modifiers.gptq import GPTQModifier

DEFAULT_ENGINE = "llmcompressor"
GPTQ_ENGINES: Registry[type[Backend[BackendOptions]]] = Registry(
    "GPTQ engine (options.engine)",
    {
        "llmcompressor": "quantkit.backends.gptq:GPTQBackend",
        "gptqmodel": "quantkit.backends.gptq_gptqmodel:GPTQModelBackend",
    },
    RecipeError,
)


class GPTQOptions(IntWeightOptions):
    """GPTQ: second-order weight rounding layer by layer, on calibration activations."""

    actorder: Literal["static", "group", "weight"] | None = Field(
        "static", description="activation ordering (desc_act): static/weight keep the format, group reorders"
    )
    dampening_frac: float = Field(
        0.01, gt=0, lt=1, description="Hessian dampening, fraction of the mean diagonal"
    )
    block_size: int = Field(128, ge=1, description="columns quantized per GPTQ block")
    engine: Literal["llmcompressor"] = Field(
        "llmcompressor", description="implementation: llmcompressor | gptqmodel (its own options)"
    )


def _engine_bits(backend: type[Backend[BackendOptions]]) -> tuple[int, ...]:
    """The bit widths an engine's options accept (its ``bits`` Literal)."""
    return tuple(int(b) for b in typing.get_args(backend.options_model.model_fields["bits"].annotation))


def check_engine_options(engine: str, raw: Mapping[str, JsonValue]) -> None:
    """Refuse an option or a bit width that only another GPTQ engine has, naming that engine."""
    chosen = GPTQ_ENGINES.get(engine)
    others = {name: GPTQ_ENGINES.get(name) for name in GPTQ_ENGINES.names() if name != engine}
    for key in raw:
        owners = [name for name, other in others.items() if key in other.options_model.model_fields]
        if key not in chosen.options_model.model_fields and owners:
            raise RecipeError(
                f"options.{key} is an option of the GPTQ engine {' and '.join(owners)}, not of {engine}",
                f"remove options.{key}, or set options.engine={owners[0]}",
            )
    bits = raw.get("bits")
    allowed = _engine_bits(chosen)
    if isinstance(bits, int) and not isinstance(bits, bool) and bits not in allowed:
        shown = ", ".join(map(str, allowed[:-1])) + f" or {allowed[-1]}"
        able = [name for name, other in others.items() if bits in _engine_bits(other)]
        hint = f"set options.engine={able[0]}" if able else f"use options.bits {shown}"
        raise RecipeError(f"options.bits={bits}: the GPTQ engine {engine} quantizes to {shown} bits", hint)


class GPTQBackend(IntWeightBackend[GPTQOptions]):
    """GPTQ W{3,4,8}A16 via llm-compressor (sequential, layer by layer)."""

    name = "gptq"
    summary = "GPTQ integer weights (W4A16/W8A16/W3A16) via llm-compressor or GPTQModel (options.engine)"
    options_model = GPTQOptions

    @classmethod
    def from_raw(cls, raw: Mapping[str, JsonValue]) -> Backend[BackendOptions]:
        """The engine ``raw["engine"]`` names (default llm-compressor) with its options."""
        engine = raw.get("engine", DEFAULT_ENGINE)
        if not isinstance(engine, str):
            raise RecipeError(
                f"options.engine must be a name (got {engine!r})",
                "choose one of: " + ", ".join(GPTQ_ENGINES.names()),
            )
        check_engine_options(engine, raw)
        if engine != DEFAULT_ENGINE:
            return GPTQ_ENGINES.get(engine).from_raw(raw)
        return super().from_raw(raw)

    def requires_calibration(self) -> bool:
        return True

    def modifier(self) -> GPTQModifier:
        """llm-compressor's GPTQModifier for these options."""
        from llmcompressor.modifiers.gptq import GPTQModifier

        options = self.options
        actorder = options.actorder if options.group_size else None
        return GPTQModifier(
            config_groups=options.config_groups(actorder=actorder),
            ignore=options.ignore,
            dampening_frac=options.dampening_frac,
            block_size=options.block_size,
        )

    def quantize(self, job: QuantizeJob) -> Artifact:
        artifact = self._run(job, self.modifier(), calibrated=True)
        artifact.details["engine"] = "llmcompressor"
        return artifact
