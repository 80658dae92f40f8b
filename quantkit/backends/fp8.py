"""FP8 weights (E4M3) through llm-compressor, saved as a compressed-tensors checkpoint."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from quantkit.backends.base import Artifact, Backend, BackendOptions, QuantizeJob
from quantkit.backends.llmcompressor_run import run_oneshot
from quantkit.backends.llmcompressor_session import released_session


class FP8Options(BackendOptions):
    """FP8 options. ``FP8_DYNAMIC``: per-channel weights, per-token dynamic activations, no
    calibration. ``FP8``: per-tensor weights and static activation scales from calibration.
    ``FP8_BLOCK``: 128x128 block weight scales, dynamic activations."""

    scheme: Literal["FP8_DYNAMIC", "FP8", "FP8_BLOCK"] = "FP8_DYNAMIC"
    targets: list[str] = Field(default_factory=lambda: ["Linear"], min_length=1)
    ignore: list[str] = Field(default_factory=lambda: ["lm_head"])


class FP8Backend(Backend[FP8Options]):
    """FP8 (E4M3) weight quantization through llm-compressor's QuantizationModifier."""

    name = "fp8"
    summary = "FP8 E4M3 weights (dynamic or static activations) via llm-compressor"
    options_model = FP8Options
    runtime = "hf"
    library = "llmcompressor"

    def requires_calibration(self) -> bool:
        return self.options.scheme == "FP8"

    def speed_caveat(self, device: str) -> str | None:
        if device == "cuda":
            return None
        return (
            "FP8 runs emulated here: on the CPU transformers decompresses the FP8 weights to the compute "
            "dtype in every forward (no FP8 kernels), so its speed ratios show that cost; FP8 GEMMs need an "
            "Ada or Hopper GPU (vLLM, ModelOpt)"
        )

    def describe(self) -> tuple[str, float]:
        return self.options.scheme, 8.0

    def quantize(self, job: QuantizeJob) -> Artifact:
        from llmcompressor.modifiers.quantization import QuantizationModifier

        options = self.options
        modifier = QuantizationModifier(targets=options.targets, scheme=options.scheme, ignore=options.ignore)
        calibration = job.calibration if self.requires_calibration() else None
        with released_session():
            details = run_oneshot(job, modifier, calibration)
        scheme, bits = self.describe()
        return Artifact(
            path=job.out_dir,
            format="compressed-tensors",
            runtime=self.runtime,
            scheme=scheme,
            weight_bits=bits,
            details=details,
        )
