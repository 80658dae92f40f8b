"""Integer weight-only schemes (W{3,4,8}A16) shared by the GPTQ, AWQ and RTN backends."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal, TypeVar

from pydantic import Field, JsonValue, field_validator

from quantkit.backends.base import Artifact, Backend, BackendOptions, QuantizeJob
from quantkit.backends.int_overrides import (
    IntOverride,
    IntScheme,
    bits_per_module,
    check_group_size,
    int_effective_bits,
    int_scheme_name,
    quantized_linears,
)
from quantkit.errors import RecipeError

if TYPE_CHECKING:
    from pathlib import Path

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
        return None if value is None or value == -1 else check_group_size(value)

    def scheme_name(self) -> str:
        return int_scheme_name(self.bits, self.group_size, self.symmetric)

    def effective_bits(self) -> float:
        """Bits per weight including the fp16 scale (and zero point) per group."""
        return int_effective_bits(self.bits, self.group_size, self.symmetric)


def weights_args(scheme: IntSchemeOptions | IntScheme, actorder: str | None = None) -> dict[str, JsonValue]:
    """compressed-tensors ``QuantizationArgs`` for a scheme's weights."""
    args: dict[str, JsonValue] = {
        "num_bits": scheme.bits,
        "type": "int",
        "symmetric": scheme.symmetric,
        "strategy": "group" if scheme.group_size else "channel",
    }
    if scheme.group_size:
        args["group_size"] = scheme.group_size
    if actorder is not None and scheme.group_size:
        args["actorder"] = actorder
    return args


class IntWeightOptions(IntSchemeOptions):
    """Integer weights through llm-compressor (compressed-tensors), on the modules ``targets``
    names except those ``ignore`` names; ``overrides`` give named layers schemes of their own."""

    bits: Literal[3, 4, 8] = Field(4, description="weight bits (W3A16, W4A16, W8A16)")
    targets: list[str] = Field(default_factory=lambda: ["Linear"], min_length=1)
    ignore: list[str] = Field(default_factory=lambda: ["lm_head"])
    overrides: list[IntOverride] = Field(
        default_factory=list, description="per-layer schemes: targets plus bits/group_size/symmetric"
    )

    def weights_args(self, actorder: str | None = None) -> dict[str, JsonValue]:
        """compressed-tensors ``QuantizationArgs`` for the weights."""
        return weights_args(self, actorder)

    def resolved_overrides(self) -> list[IntScheme]:
        """The overrides with what each left out taken from this scheme."""
        return [o.resolved(self.bits, self.group_size, self.symmetric) for o in self.overrides]

    def config_groups(self, actorder: str | None = None) -> dict[str, JsonValue]:
        """One config group for the scheme, one more per override (name targets outrank the
        base group's class target in compressed-tensors)."""
        targets: list[JsonValue] = list(self.targets)
        groups: dict[str, JsonValue] = {
            "group_0": {"targets": targets, "weights": self.weights_args(actorder)}
        }
        for index, override in enumerate(self.resolved_overrides(), start=1):
            names: list[JsonValue] = list(override.targets)
            groups[f"group_{index}"] = {"targets": names, "weights": weights_args(override, actorder)}
        return groups

    def bits_per_module(self, shapes: Mapping[str, tuple[list[int], str]]) -> dict[str, float]:
        """Each quantized decoder linear layer's effective bits per weight (refusing overrides
        that name none, overlap, or misfit a layer's width)."""
        modules = quantized_linears(shapes, self.ignore)
        return bits_per_module(self.resolved_overrides(), modules, self.effective_bits())


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

    def check_weights(self, model_path: Path) -> None:
        """Per-layer overrides must name this model's quantized layers, once each, and fit them."""
        options = self.options
        if isinstance(options, IntWeightOptions) and options.overrides:
            from quantkit.inputs.plan import tensor_shapes

            shapes = tensor_shapes(model_path)
            if shapes:  # no safetensors headers: compressed-tensors' names are checked on the artifact
                options.bits_per_module(shapes)

    def speed_caveat(self, device: str) -> str | None:
        if device == "cuda":
            return None
        return (
            "packed integer weights run emulated here: on the CPU compressed-tensors unpacks and "
            "dequantizes them in every forward (no W4A16 kernels), so their speed ratios show that cost; "
            "the speed-up needs a GPU runtime with Marlin/Machete kernels (vLLM)"
        )

    def describe(self) -> tuple[str, float]:
        options = self.options
        scheme = options.scheme_name()
        if isinstance(options, IntWeightOptions) and options.overrides:
            scheme += " + " + ", ".join(o.scheme_name() for o in options.resolved_overrides())
        return scheme, options.effective_bits()

    def _run(self, job: QuantizeJob, recipe: OneshotRecipe, calibrated: bool) -> Artifact:
        from quantkit.backends.llmcompressor_run import run_oneshot
        from quantkit.backends.llmcompressor_session import released_session

        with released_session():
            details = run_oneshot(job, recipe, job.calibration if calibrated else None)
        scheme, bits = self.describe()
        options = self.options
        if isinstance(options, IntWeightOptions) and options.overrides:
            bits = _check_mixed_artifact(options, job, details)
        return Artifact(job.out_dir, "compressed-tensors", self.runtime, scheme, bits, details)


def _check_mixed_artifact(
    options: IntWeightOptions, job: QuantizeJob, details: dict[str, JsonValue]
) -> float:
    """Read every layer's stored bits back from the artifact, record the overrides and the
    modules each named, and return the mean bits per quantized weight."""
    from quantkit.backends.int_overrides import assign, check_artifact, mean_bits, overrides_record
    from quantkit.inputs.plan import tensor_shapes

    source = tensor_shapes(job.model_path)
    modules = quantized_linears(source, options.ignore)
    overrides = options.resolved_overrides()
    owner = assign(overrides, modules)
    expected = {name: overrides[owner[name]].bits if name in owner else options.bits for name in modules}
    check_artifact(tensor_shapes(job.out_dir), modules, expected)
    details["overrides"] = overrides_record(overrides, owner)
    return round(mean_bits(bits_per_module(overrides, modules, options.effective_bits()), source), 4)
