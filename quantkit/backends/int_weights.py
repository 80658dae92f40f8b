"""Integer weight-only schemes (W{3,4,8}A16) shared by the GPTQ, AWQ and RTN backends."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from quantkit.backends.base import Artifact, Backend, BackendOptions, QuantizeJob
from quantkit.errors import RecipeError


class IntWeightOptions(BackendOptions):
    """Integer weights, 16-bit activations. ``group_size: null`` means one scale per output
    channel; otherwise one scale (and zero point when asymmetric) per group of input columns."""

    bits: Literal[3, 4, 8] = Field(4, description="weight bits (W3A16, W4A16, W8A16)")
    group_size: int | None = Field(128, description="input columns per scale; null = per channel")
    symmetric: bool = Field(True, description="symmetric (no zero point) or asymmetric weights")
    targets: list[str] = Field(default_factory=lambda: ["Linear"], min_length=1)
    ignore: list[str] = Field(default_factory=lambda: ["lm_head"])

    @field_validator("group_size")
    @classmethod
    def _power_of_two(cls, value: int | None) -> int | None:
        if value is None or value == -1:
            return None
        if value < 8 or value & (value - 1):
            raise ValueError("must be a power of two >= 8 (e.g. 32, 64, 128) or null for per-channel")
        return value

    def scheme_name(self) -> str:
        group = f"g{self.group_size}" if self.group_size else "per-channel"
        return f"W{self.bits}A16-{group}{'' if self.symmetric else '-asym'}"

    def weights_args(self, **extra: Any) -> dict[str, Any]:
        """compressed-tensors ``QuantizationArgs`` for the weights."""
        args: dict[str, Any] = {
            "num_bits": self.bits,
            "type": "int",
            "symmetric": self.symmetric,
            "strategy": "group" if self.group_size else "channel",
        }
        if self.group_size:
            args["group_size"] = self.group_size
        return args | extra

    def config_groups(self, **extra: Any) -> dict[str, Any]:
        return {"group_0": {"targets": list(self.targets), "weights": self.weights_args(**extra)}}

    def effective_bits(self) -> float:
        """Bits per weight including the fp16 scale (and zero point) per group."""
        if not self.group_size:
            return float(self.bits)
        overhead = 16 + (0 if self.symmetric else self.bits)
        return self.bits + overhead / self.group_size


def check_group_size_divides(options: IntWeightOptions, config: dict[str, Any]) -> None:
    """Refuse a group size that does not divide the model's linear input widths."""
    if not options.group_size:
        return
    widths: dict[str, int] = {
        name: int(config[name])
        for name in ("hidden_size", "intermediate_size")
        if isinstance(config.get(name), int)
    }
    bad = {name: width for name, width in widths.items() if width % options.group_size}
    if bad:
        shown = ", ".join(f"{name}={width}" for name, width in bad.items())
        fits = [g for g in (32, 64, 128) if all(w % g == 0 for w in widths.values())]
        hint = f"use options.group_size={fits[-1]}" if fits else "use options.group_size=null (per channel)"
        raise RecipeError(f"options.group_size={options.group_size} does not divide {shown}", hint)


class IntWeightBackend(Backend):
    """Shared behaviour of the integer weight-only backends (GPTQ, AWQ, RTN via llm-compressor)."""

    runtime = "hf"
    library = "llmcompressor"

    @classmethod
    def check_model(cls, options: Any, config: dict[str, Any]) -> None:
        check_group_size_divides(options, config)

    @classmethod
    def describe(cls, options: Any) -> tuple[str, float]:
        return options.scheme_name(), options.effective_bits()

    def _run(self, job: QuantizeJob, recipe: Any, calibration: Any) -> Artifact:
        from quantkit.backends.llmcompressor_run import run_oneshot

        details = run_oneshot(job, recipe, calibration)
        scheme, bits = self.describe(job.options)
        return Artifact(job.out_dir, "compressed-tensors", self.runtime, scheme, bits, details)
