"""AWQ through llm-compressor: activation-aware scale search, then integer weight rounding."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from quantkit.backends.base import Artifact, QuantizeJob
from quantkit.backends.int_weights import IntWeightBackend, IntWeightOptions
from quantkit.errors import RecipeError


class AWQOptions(IntWeightOptions):
    """AWQ: scales salient input channels (found from calibration activations) before rounding."""

    symmetric: bool = Field(False, description="AWQ keeps a zero point by default (asymmetric)")
    duo_scaling: bool | Literal["both"] = Field(
        True, description="use weights as well as activations for scales"
    )
    n_grid: int = Field(20, ge=2, le=200, description="grid points of the scale search")


class AWQBackend(IntWeightBackend[AWQOptions]):
    """AWQ W{3,4,8}A16 via llm-compressor's AWQ transform + QuantizationModifier."""

    name = "awq"
    summary = "AWQ activation-aware integer weights (W4A16) via llm-compressor"
    options_model = AWQOptions

    def requires_calibration(self) -> bool:
        return True

    def check_options(self) -> None:
        """AWQ's scale search balances layers that share an input (q/k/v, gate/up) under one
        group size and zero point: an override may change their bits only."""
        options = self.options
        for index, override in enumerate(options.resolved_overrides()):
            if (override.group_size, override.symmetric) != (options.group_size, options.symmetric):
                raise RecipeError(
                    f"options.overrides[{index}] changes the group size or symmetry, which AWQ's scale "
                    "search cannot mix",
                    "with awq give overrides bits only, or use gptq or rtn",
                )

    def quantize(self, job: QuantizeJob) -> Artifact:
        from llmcompressor.modifiers.quantization import QuantizationModifier
        from llmcompressor.modifiers.transform.awq import AWQModifier

        options = self.options
        recipe = [
            AWQModifier(duo_scaling=options.duo_scaling, n_grid=options.n_grid),
            QuantizationModifier(config_groups=options.config_groups(), ignore=options.ignore),
        ]
        return self._run(job, recipe, calibrated=True)
