"""Round-to-nearest integer weights through llm-compressor: the reference point for GPTQ/AWQ."""

from __future__ import annotations

from typing import Any

from quantkit.backends.base import Artifact, Backend, QuantizeJob
from quantkit.backends.int_weights import IntWeightOptions, check_group_size_divides
from quantkit.backends.llmcompressor_run import run_oneshot


class RTNOptions(IntWeightOptions):
    """Round-to-nearest with min-max scales; no calibration."""


class RTNBackend(Backend):
    """RTN W{3,4,8}A16 via llm-compressor's QuantizationModifier (data-free)."""

    name = "rtn"
    summary = "round-to-nearest integer weights (data-free baseline for GPTQ/AWQ)"
    Options = RTNOptions
    runtime = "hf"
    library = "llmcompressor"

    @classmethod
    def requires_calibration(cls, options: Any) -> bool:
        return False

    @classmethod
    def check_model(cls, options: Any, config: dict[str, Any]) -> None:
        check_group_size_divides(options, config)

    @classmethod
    def describe(cls, options: Any) -> tuple[str, float]:
        return options.scheme_name(), options.effective_bits()

    def quantize(self, job: QuantizeJob) -> Artifact:
        from llmcompressor.modifiers.quantization import QuantizationModifier

        options: RTNOptions = job.options  # type: ignore[assignment]
        modifier = QuantizationModifier(config_groups=options.config_groups(), ignore=options.ignore)
        details = run_oneshot(job, modifier, None)
        scheme, bits = self.describe(options)
        return Artifact(job.out_dir, "compressed-tensors", self.runtime, scheme, bits, details)
