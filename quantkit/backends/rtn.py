"""Round-to-nearest integer weights through llm-compressor: the reference point for GPTQ/AWQ."""

from __future__ import annotations

from typing import Any

from quantkit.backends.base import Artifact, QuantizeJob
from quantkit.backends.int_weights import IntWeightBackend, IntWeightOptions


class RTNOptions(IntWeightOptions):
    """Round-to-nearest with min-max scales; no calibration."""


class RTNBackend(IntWeightBackend):
    """RTN W{3,4,8}A16 via llm-compressor's QuantizationModifier (data-free)."""

    name = "rtn"
    summary = "round-to-nearest integer weights (data-free baseline for GPTQ/AWQ)"
    Options = RTNOptions

    @classmethod
    def requires_calibration(cls, options: Any) -> bool:
        return False

    def quantize(self, job: QuantizeJob) -> Artifact:
        from llmcompressor.modifiers.quantization import QuantizationModifier

        options: RTNOptions = job.options  # type: ignore[assignment]
        modifier = QuantizationModifier(config_groups=options.config_groups(), ignore=options.ignore)
        return self._run(job, modifier, None)
