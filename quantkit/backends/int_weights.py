"""Integer weight-only schemes (W{3,4,8}A16) shared by the GPTQ, AWQ and RTN backends."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal, TypeVar

from pydantic import Field, JsonValue, field_validator

from quantkit.backends.base import Artifact, Backend, BackendOptions, QuantizeJob
from quantkit.errors import RecipeError

if TYPE_CHECKING:
    from quantkit.backends.llmcompressor_run import OneshotRecipe


class IntSchemeOptions(BackendOptions):
    """Integer weights, 16-bit activations. ``group_size: null`` means one scale per output
    channel; otherwise one scale (and zero point when asymmetric) per group of input columns.
    What every integer weight-only engine shares (llm-compressor's and GPTQModel's)."""

    bits: int = Field(4, description="weight bits")
    group_size: int | None = Field(128, description="input columns per scale; null = per channel")
    symmetric: bool = Field(True, description="symmetric (no zero point) or asymmetric weights")

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

    def effective_bits(self) -> float:
        """Bits per weight including the fp16 scale (and zero point) per group."""
        if not self.group_size:
            return float(self.bits)
        overhead = 16 + (0 if self.symmetric else self.bits)
        return self.bits + overhead / self.group_size


class IntWeightOptions(IntSchemeOptions):
    """Integer weights through llm-compressor (compressed-tensors), on the modules ``targets``
    names except those ``ignore`` names."""

    bits: Literal[3, 4, 8] = Field(4, description="weight bits (W3A16, W4A16, W8A16)")
    targets: list[str] = Field(default_factory=lambda: ["Linear"], min_length=1)
    ignore: list[str] = Field(default_factory=lambda: ["lm_head"])

    def weights_args(self, actorder: str | None = None) -> dict[str, JsonValue]:
        """compressed-tensors ``QuantizationArgs`` for the weights."""
        args: dict[str, JsonValue] = {
            "num_bits": self.bits,
            "type": "int",
            "symmetric": self.symmetric,
            "strategy": "group" if self.group_size else "channel",
        }
        if self.group_size:
            args["group_size"] = self.group_size
        if actorder is not None:
            args["actorder"] = actorder
        return args

    def config_groups(self, actorder: str | None = None) -> dict[str, JsonValue]:
        targets: list[JsonValue] = list(self.targets)
        return {"group_0": {"targets": targets, "weights": self.weights_args(actorder)}}


def check_group_size_divides(options: IntSchemeOptions, config: Mapping[str, JsonValue]) -> None:
    """Refuse a group size that does not divide the model's linear input widths."""
    if not options.group_size:
        return
    widths: dict[str, int] = {
        name: value
        for name in ("hidden_size", "intermediate_size")
        if isinstance(value := config.get(name), int)
    }
    bad = {name: width for name, width in widths.items() if width % options.group_size}
    if bad:
        shown = ", ".join(f"{name}={width}" for name, width in bad.items())
        fits = [g for g in (32, 64, 128) if all(w % g == 0 for w in widths.values())]
        hint = f"use options.group_size={fits[-1]}" if fits else "use options.group_size=null (per channel)"
        raise RecipeError(f"options.group_size={options.group_size} does not divide {shown}", hint)


IntOptionsT = TypeVar("IntOptionsT", bound=IntSchemeOptions, covariant=True)


class IntWeightBackend(Backend[IntOptionsT]):
    """Shared behaviour of the integer weight-only backends (GPTQ, AWQ, RTN via llm-compressor;
    GPTQ via GPTQModel)."""

    runtime = "hf"
    library = "llmcompressor"

    def check_model(self, config: Mapping[str, JsonValue]) -> None:
        check_group_size_divides(self.options, config)

    def describe(self) -> tuple[str, float]:
        return self.options.scheme_name(), self.options.effective_bits()

    def _run(self, job: QuantizeJob, recipe: OneshotRecipe, calibrated: bool) -> Artifact:
        from quantkit.backends.llmcompressor_run import run_oneshot

        details = run_oneshot(job, recipe, job.calibration if calibrated else None)
        scheme, bits = self.describe()
        return Artifact(job.out_dir, "compressed-tensors", self.runtime, scheme, bits, details)
