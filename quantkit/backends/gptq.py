"""GPTQ through llm-compressor's GPTQModifier (compressed-tensors pack-quantized output)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from quantkit.backends.base import Artifact, QuantizeJob
from quantkit.backends.int_weights import IntWeightBackend, IntWeightOptions

if TYPE_CHECKING:
    from llmcompressor.modifiers.gptq import GPTQModifier


class GPTQOptions(IntWeightOptions):
    """GPTQ: second-order weight rounding layer by layer, on calibration activations."""

    actorder: Literal["static", "group", "weight"] | None = Field(
        "static", description="activation ordering (desc_act): static/weight keep the format, group reorders"
    )
    dampening_frac: float = Field(
        0.01, gt=0, lt=1, description="Hessian dampening, fraction of the mean diagonal"
    )
    block_size: int = Field(128, ge=1, description="columns quantized per GPTQ block")
    engine: Literal["llmcompressor"] = Field("llmcompressor", description="implementation")


class GPTQBackend(IntWeightBackend[GPTQOptions]):
    """GPTQ W{3,4,8}A16 via llm-compressor (sequential, layer by layer)."""

    name = "gptq"
    summary = "GPTQ integer weights (W4A16/W8A16/W3A16) via llm-compressor"
    options_model = GPTQOptions

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
        return self._run(job, self.modifier(), calibrated=True)
