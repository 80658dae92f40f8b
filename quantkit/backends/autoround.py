"""AutoRound (``method: autoround``): sign-gradient rounding and min-max tuning block by block
(intel/auto-round), on quantkit's calibration ids. Two output types, picked by
``options.format``: an integer weight-only checkpoint transformers and vLLM load (``auto_round``,
``auto_gptq`` or ``auto_awq``), or AutoRound's own GGUF export (``gguf:q4_k_m`` ...), which
quantkit evaluates in llama.cpp like its own GGUFs. Each output type has its own typed options;
one the chosen type lacks is refused naming the type that has it."""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import Field, JsonValue

from quantkit.backends.base import Artifact, Backend, BackendOptions, QuantizeJob
from quantkit.backends.int_weights import IntSchemeOptions, check_group_size_divides
from quantkit.errors import RecipeError
from quantkit.registry import did_you_mean

HFFormat = Literal["auto_round", "auto_gptq", "auto_awq"]
# AutoRound 0.15's GGUF export types (its GGUFFormat.support_schemes; q2_k_mixed is for MoE only)
GGUFFormat = Literal[
    "gguf:q4_0", "gguf:q4_1", "gguf:q5_0", "gguf:q5_1", "gguf:q2_k_s", "gguf:q3_k_s", "gguf:q3_k_m",
    "gguf:q3_k_l", "gguf:q4_k_s", "gguf:q4_k_m", "gguf:q5_k_s", "gguf:q5_k_m", "gguf:q6_k", "gguf:q8_0",
]  # fmt: skip
# What AutoRound takes from elsewhere in a quantkit recipe (the shared calibration set, the run seed).
FROM_THE_RECIPE = {
    "nsamples": "calibration.num_samples",
    "seqlen": "calibration.seq_len",
    "dataset": "calibration.source",
    "seed": "seed (the run's seed, shared by every engine)",
}


class AutoRoundTuning(BackendOptions):
    """AutoRound's tuning options (its own names), shared by both output types. The samples and
    their length are the recipe's calibration section; the seed is the run's."""

    iters: int = Field(
        200, ge=0, description="tuning steps per block (AutoRound: 200); 0 = its RTN mode (no tuning)"
    )
    lr: float | None = Field(None, gt=0, description="rounding learning rate; null = 1/iters (AutoRound)")
    minmax_lr: float | None = Field(None, gt=0, description="min-max (scale) learning rate; null = lr")
    enable_minmax_tuning: bool = Field(True, description="tune the weight clipping range with the rounding")
    enable_quanted_input: bool = Field(
        True, description="each block tuned on the quantized output of the blocks before it"
    )
    enable_norm_bias_tuning: bool = Field(False, description="also tune norms and biases (experimental)")
    nblocks: int = Field(1, ge=1, description="decoder blocks tuned together")
    batch_size: int = Field(8, ge=1, description="calibration samples per tuning step")
    gradient_accumulate_steps: int = Field(1, ge=1, description="steps accumulated per update")
    not_use_best_mse: bool = Field(False, description="keep the last step's rounding, not the best one's")
    dynamic_max_gap: int = Field(-1, description="stop a block after this many steps without a better loss")
    enable_torch_compile: bool = Field(
        False, description="torch.compile each block while tuning (AutoRound's auto: on from 10 iters)"
    )
    ignore: list[str] = Field(
        default_factory=lambda: ["lm_head"],
        description="modules left unquantized (names or name fragments; AutoRound's ignore_layers)",
    )

    def tuning_kwargs(self) -> dict[str, JsonValue]:
        """AutoRound's keyword arguments for the tuning (``ignore`` goes as ``ignore_layers``)."""
        kwargs: dict[str, JsonValue] = {
            "iters": self.iters,
            "lr": self.lr,
            "minmax_lr": self.minmax_lr,
            "enable_minmax_tuning": self.enable_minmax_tuning,
            "enable_quanted_input": self.enable_quanted_input,
            "enable_norm_bias_tuning": self.enable_norm_bias_tuning,
            "nblocks": self.nblocks,
            "batch_size": self.batch_size,
            "gradient_accumulate_steps": self.gradient_accumulate_steps,
            "not_use_best_mse": self.not_use_best_mse,
            "dynamic_max_gap": self.dynamic_max_gap,
            "enable_torch_compile": self.enable_torch_compile,
        }
        if self.iters == 0:  # AutoRound's RTN mode: the tuning options would only be logged as ignored
            kwargs = {key: kwargs[key] for key in ("iters", "batch_size", "enable_torch_compile")}
        layers = [name for name in self.ignore if name != "lm_head"]  # AutoRound never quantizes the head
        if layers:
            kwargs["ignore_layers"] = ",".join(layers)
        return kwargs


class AutoRoundOptions(AutoRoundTuning, IntSchemeOptions):
    """Integer weights, 16-bit activations, saved in a checkpoint format transformers loads
    (``bits``, ``group_size`` and ``symmetric`` as in quantkit's other integer recipes)."""

    format: HFFormat = Field(
        "auto_round", description="auto_round (AutoRound's own) | auto_gptq | auto_awq (4-bit only)"
    )
    bits: Literal[2, 3, 4, 8] = Field(4, description="weight bits (W2A16, W3A16, W4A16, W8A16)")

    def scheme_kwargs(self) -> dict[str, JsonValue]:
        """AutoRound's scheme keyword arguments."""
        return {"bits": self.bits, "group_size": self.group_size or -1, "sym": self.symmetric}


class AutoRoundGGUFOptions(AutoRoundTuning):
    """AutoRound's GGUF export: the GGUF type fixes bits, groups and zero points."""

    format: GGUFFormat = Field("gguf:q4_k_m", description="AutoRound's GGUF export type (gguf:q4_k_m, ...)")


def _format_of(raw: Mapping[str, JsonValue]) -> str:
    value = raw.get("format", "auto_round")
    if not isinstance(value, str):
        raise RecipeError(f"options.format must be a name (got {value!r})", "e.g. auto_round or gguf:q4_k_m")
    return value


def check_autoround_options(raw: Mapping[str, JsonValue]) -> None:
    """Refuse an option AutoRound lacks (naming where quantkit takes it from, or the output type
    that has it) and bits or formats it cannot write, before pydantic's generic messages."""
    fmt = _format_of(raw)
    gguf = fmt.startswith("gguf:")
    hf_formats = typing.get_args(HFFormat)
    gguf_formats = typing.get_args(GGUFFormat)
    if fmt not in hf_formats + gguf_formats:
        raise RecipeError(
            f"options.format={fmt}: AutoRound (in quantkit) writes {', '.join(hf_formats)} or a GGUF type",
            did_you_mean(fmt, list(hf_formats + gguf_formats)),
        )
    chosen: type[AutoRoundTuning] = AutoRoundGGUFOptions if gguf else AutoRoundOptions
    for key in raw:
        if key in chosen.model_fields:
            continue
        if key in FROM_THE_RECIPE:
            raise RecipeError(
                f"options.{key}: AutoRound takes it from the recipe's {FROM_THE_RECIPE[key]} here",
                f"remove options.{key}; set {FROM_THE_RECIPE[key].split(' ')[0]} instead",
            )
        if key in AutoRoundOptions.model_fields:  # the GGUF types' options are a subset
            raise RecipeError(
                f"options.{key} is not an option of AutoRound's format {fmt} (the GGUF type fixes it)",
                f"remove options.{key}, or set options.format=auto_round",
            )
        raise RecipeError(
            f"options.{key} is not an option of method autoround",
            did_you_mean(key, sorted(chosen.model_fields)),
        )
    bits = raw.get("bits")
    allowed = typing.get_args(AutoRoundOptions.model_fields["bits"].annotation)
    if isinstance(bits, int) and not isinstance(bits, bool) and bits not in allowed:
        raise RecipeError(
            f"options.bits={bits}: AutoRound's integer formats hold 2, 3, 4 or 8 bits",
            "use options.bits 2, 3, 4 or 8 (or a GGUF type, e.g. options.format=gguf:q5_k_m)",
        )
    if fmt == "auto_awq" and bits not in (None, 4):
        raise RecipeError(
            f"options.bits={bits}: the auto_awq format holds 4-bit weights only",
            "use options.format=auto_round",
        )


TuningT = TypeVar("TuningT", bound=AutoRoundTuning, covariant=True)


class _AutoRoundCommon(Backend[TuningT]):
    """What both output types share: calibration, the engine check, the method name."""

    name = "autoround"
    library = "auto-round"

    @classmethod
    def from_raw(cls, raw: Mapping[str, JsonValue]) -> Backend[BackendOptions]:
        """The output type ``raw["format"]`` names (default auto_round), with its own options."""
        check_autoround_options(raw)
        target: type[Backend[BackendOptions]] = (
            AutoRoundGGUFBackend if _format_of(raw).startswith("gguf:") else AutoRoundBackend
        )
        options = target.options_model.model_validate(dict(raw))
        return target(options)

    def requires_calibration(self) -> bool:
        return True  # also at iters 0: AutoRound's RTN mode weighs rounding by an importance matrix

    def check_dependencies(self) -> None:
        from quantkit.backends.autoround_run import autoround_version

        autoround_version()


class AutoRoundBackend(_AutoRoundCommon[AutoRoundOptions]):
    """AutoRound W{2,3,4,8}A16 into auto_round / auto_gptq / auto_awq checkpoints (transformers)."""

    summary = "AutoRound sign-gradient rounding (W2/W3/W4/W8; auto_round, auto_gptq, auto_awq or GGUF)"
    options_model = AutoRoundOptions
    runtime = "hf"

    def check_model(self, config: Mapping[str, JsonValue]) -> None:
        check_group_size_divides(self.options, config)

    def describe(self) -> tuple[str, float]:
        return self.options.scheme_name(), self.options.effective_bits()

    def quantize(self, job: QuantizeJob) -> Artifact:
        from quantkit.backends.autoround_run import run_autoround

        options = self.options
        details = run_autoround(job, options.tuning_kwargs() | options.scheme_kwargs(), options.format)
        details |= {"checkpoint_format": options.format}
        scheme, bits = self.describe()
        return Artifact(job.out_dir, options.format, self.runtime, scheme, bits, details)


class AutoRoundGGUFBackend(_AutoRoundCommon[AutoRoundGGUFOptions]):
    """AutoRound's GGUF export (its own llama.cpp conversion and packing), run by llama.cpp."""

    summary = AutoRoundBackend.summary
    options_model = AutoRoundGGUFOptions
    runtime = "llamacpp"

    def describe(self) -> tuple[str, float]:
        from quantkit.backends.gguf import NOMINAL_BITS

        kind = self.options.format.removeprefix("gguf:").upper()
        return f"{kind} (AutoRound)", NOMINAL_BITS.get(kind) or {"Q4_1": 5.0, "Q5_1": 6.0}[kind]

    def quantize(self, job: QuantizeJob) -> Artifact:
        from quantkit.backends.autoround_run import run_autoround
        from quantkit.backends.gguf import inspect_gguf

        details = run_autoround(job, self.options.tuning_kwargs(), self.options.format)
        info = inspect_gguf(job.out_dir / "model.gguf")
        details |= info.details() | {"checkpoint_format": "gguf"}
        scheme, _ = self.describe()
        return Artifact(job.out_dir, "gguf", self.runtime, scheme, info.bits_per_weight, details)

    def runtime_baseline(self, model_path: Path, log: Callable[[str], None]) -> Path | None:
        """The F16 GGUF of llama.cpp's converter, as for quantkit's own GGUFs."""
        from quantkit.backends.gguf import GGUFBackend, GGUFOptions

        return GGUFBackend(GGUFOptions()).runtime_baseline(model_path, log)
