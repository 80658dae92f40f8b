"""The sections of a recipe (text sources, eval, gates, bench, lm-eval): strict pydantic models.

They import nothing else of quantkit but the metric registry (the gate's fields), so backends,
runtimes and stages can use them without pulling in recipe loading.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidatorFunctionWrapHandler,
    create_model,
    model_validator,
)

from quantkit.metrics import METRICS, MetricInfo

RunKind = Literal["quantized", "external"]  # made by a backend, or an existing artifact imported


class StrictModel(BaseModel):
    """Base for every recipe section: unknown fields are errors."""

    model_config = ConfigDict(extra="forbid")


class TextSource(StrictModel):
    """Where text comes from: ``builtin``, a local ``.txt``/``.jsonl`` file, or ``hf:<dataset>``."""

    source: str = "builtin"
    text_field: str = Field("text", description="field holding the text in .jsonl / HF datasets")
    split: str = Field("train", description="HF dataset split")
    subset: str | None = Field(None, description="HF dataset configuration name")
    add_bos: bool | None = Field(
        None,
        description="start every window with the model's BOS (default: when its tokenizer adds one)",
    )


class CalibrationSpec(TextSource):
    """Calibration tokens: ``num_samples`` windows of ``seq_len`` tokens, sampled with ``seed``."""

    num_samples: int = Field(32, ge=1, le=100_000)
    seq_len: int = Field(256, ge=8, le=131_072)
    seed: int = 0
    chat_template: bool = Field(False, description="render each document as a user turn of the chat template")


class EvalSpec(TextSource):
    """Evaluation windows: ``num_windows`` consecutive windows of ``seq_len`` tokens of the text,
    from window ``first_window`` on (0: the first ones)."""

    num_windows: int = Field(24, ge=1, le=100_000)
    first_window: int = Field(
        0, ge=0, le=100_000, description="windows skipped first (held-out windows: ones a search did not see)"
    )
    seq_len: int = Field(512, ge=8, le=131_072)
    top_k: int = Field(32, ge=1, le=1024, description="baseline log-probs kept per position for KLD")
    tail_samples: int = Field(
        64,
        ge=0,
        le=4096,
        description="ids drawn per position from the baseline's tail for the KLD (0: top-k + rest bound)",
    )
    batch_size: int = Field(4, ge=1, le=1024)
    score: Literal["all", "second_half"] = Field(
        "all",
        description="positions scored: every prediction in a window, or its second half only "
        "(llama-perplexity's protocol: each scored token has at least seq_len/2 tokens of context)",
    )
    runtime: str | None = Field(
        None, description="score the artifact in this runtime (default: the artifact's own)"
    )
    tokenizer_check: Literal["refuse", "report"] = Field(
        "refuse",
        description="an artifact whose own tokenizer (a GGUF's) cuts text otherwise than the baseline's: "
        "refuse it, or score it and report the cost (the deployment-path score; a gate fails)",
    )


class BaselineSpec(StrictModel):
    """The unquantized baseline's precision: ``auto`` is float32 on the CPU and bfloat16 on
    CUDA (``quantkit.device``). The reference, the baseline bench and every artifact scored in
    transformers are computed in it; quantization itself loads the model in the ``auto`` one."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto (float32 on CPU, bfloat16 on CUDA) | float32 | bfloat16 | float16"
    )


class GateOptions(StrictModel):
    """The significance options of a gate; ``GateSpec`` adds a threshold field per gated metric
    of the registry (``quantkit.metrics``): ``max_<metric>`` for lower-is-better metrics,
    ``min_<metric>`` for the others. A missing metric fails its check."""

    require_significance: bool = Field(
        False, description="judge KLD, ppl and top-1 by bootstrap intervals over the eval windows"
    )
    strict_inconclusive: bool = Field(
        False, description="with require_significance: an interval straddling a threshold fails"
    )
    confidence: float = Field(0.95, gt=0, lt=1, description="confidence level of the intervals")
    bootstrap_samples: int = Field(2000, ge=100, le=1_000_000, description="bootstrap resamples")
    seed: int = Field(0, description="seed of the bootstrap resampling")
    _renamed: list[tuple[str, str]] = PrivateAttr(default_factory=list)

    @model_validator(mode="wrap")
    @classmethod
    def _note_old_names(cls, data: object, handler: ValidatorFunctionWrapHandler) -> GateOptions:
        """Fields named before they were named after their metric (``max_kld``) are read as
        the new ones; ``deprecation_notes`` says so."""
        spec: GateOptions = handler(data)
        if isinstance(data, dict):
            renamed = old_gate_fields()
            spec._renamed = [(old, renamed[old]) for old in data if old in renamed]
        return spec

    def thresholds(self) -> dict[str, float]:
        """The threshold fields that are set, by field name."""
        values = {
            name: getattr(self, name) for name in type(self).model_fields if name.startswith(("max_", "min_"))
        }
        return {name: float(value) for name, value in values.items() if value is not None}

    def is_empty(self) -> bool:
        """True when no threshold is set; the options do not count."""
        return not self.thresholds()

    def deprecation_notes(self) -> list[str]:
        return [f"gate field '{old}' is now '{new}' (the old name still works)" for old, new in self._renamed]


def old_gate_fields() -> dict[str, str]:
    """Gate fields' names before they were named after their metric -> their names now."""
    return {
        info.gate.old_field: info.gate_field for info in METRICS.gated() if info.gate and info.gate.old_field
    }


def _threshold_field(info: MetricInfo) -> tuple[object, object]:
    """(type, Field) of the gate field that bounds ``info``."""
    bound = info.gate
    assert bound is not None
    names = AliasChoices(info.gate_field, bound.old_field) if bound.old_field else None
    field = Field(None, ge=bound.ge, le=bound.le, gt=bound.gt, description=bound.help, validation_alias=names)
    return (int | None) if bound.integer else (float | None), field


def _gate_spec() -> type[GateOptions]:
    fields = {info.gate_field: _threshold_field(info) for info in METRICS.gated()}
    model: type[GateOptions] = create_model(  # type: ignore[call-overload]
        "GateSpec", __base__=GateOptions, __module__=__name__, **fields
    )
    model.__doc__ = "Thresholds a run must meet, one field per gated metric, plus the significance options."
    return model


if TYPE_CHECKING:
    GateSpec = GateOptions
else:
    GateSpec = _gate_spec()


class BenchSpec(StrictModel):
    """Speed/memory benchmark settings (a pipeline stage, on by default)."""

    enabled: bool = Field(True, description="measure speed and memory after evaluation")
    prompt_lengths: list[int] = Field(default_factory=lambda: [128, 512], min_length=1)
    decode_tokens: int = Field(32, ge=2, le=4096, description="tokens generated per timing")
    repeats: int = Field(3, ge=1, le=100, description="timings per setting (median reported)")
    batch_size: int = Field(4, ge=1, le=512, description="batch of the batched decode case (1: skip)")
    threads: int | None = Field(None, ge=1, description="CPU threads (default: all cores)")
    price_per_hour: float | None = Field(
        None, gt=0, description="USD per device-hour, for cost per 1M tokens"
    )


class LmEvalSpec(StrictModel):
    """lm-evaluation-harness tasks run on the baseline and the artifact."""

    tasks: list[str] = Field(min_length=1, description="lm-eval task names, e.g. quantkit_cloze, arc_easy")
    num_fewshot: int | None = Field(None, ge=0)
    limit: int | float | None = Field(None, gt=0, description="documents per task (int) or fraction (float)")
    batch_size: int = Field(8, ge=1)


class EvalEntry(StrictModel):
    """One entry of ``evals:``."""

    lm_eval: LmEvalSpec
