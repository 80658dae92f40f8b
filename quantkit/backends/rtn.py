"""Round-to-nearest integer weights through llm-compressor: the reference point for GPTQ/AWQ."""

from __future__ import annotations

from quantkit.backends.base import Artifact, QuantizeJob
from quantkit.backends.int_weights import IntWeightBackend, IntWeightOptions


class RTNOptions(IntWeightOptions):
    """Round-to-nearest with min-max scales; no calibration."""


class RTNBackend(IntWeightBackend[RTNOptions]):
    """RTN W{3,4,8}A16 via llm-compressor's QuantizationModifier (data-free)."""

    name = "rtn"
    summary = "round-to-nearest integer weights (data-free baseline for GPTQ/AWQ)"
    options_model = RTNOptions

    def requires_calibration(self) -> bool:
        return False

    def quantize(self, job: QuantizeJob) -> Artifact:
        from llmcompressor.modifiers.quantization import QuantizationModifier

        modifier = QuantizationModifier(
            config_groups=self.options.config_groups(), ignore=self.options.ignore
        )
        return self._run(job, modifier, calibrated=False)
