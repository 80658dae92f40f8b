"""What each stage records: typed results, stored in the journal and in the manifest's stage
records, from which a finished run is rebuilt.

A result says what it adds to the run's manifest (``metrics``, ``timings``, ``manifest_fields``),
so the manifest is assembled without naming stages (``quantkit.run.finalize``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from quantkit.evals.deployment import DeploymentScore
from quantkit.results.manifest import ArtifactInfo, BenchFailure, BenchSection, LmEvalSection
from quantkit.results.window_scores import WindowScores
from quantkit.serving.record import ServedQuality, ServeSection, side_metrics


@dataclass
class MetricSides:
    """Metric values a stage measured, on the baseline and on the artifact."""

    baseline: dict[str, float] = field(default_factory=dict)
    artifact: dict[str, float] = field(default_factory=dict)


class StageResult(BaseModel):
    """Base of stage results: strict, and with the seconds the stage took (None: reused)."""

    model_config = ConfigDict(extra="forbid")
    timing_key: ClassVar[str | None] = None  # its seconds in the manifest's timings (summed)

    seconds: float | None = None

    def metric_values(self) -> MetricSides:
        """The metric values it adds to the run's (names registered in ``quantkit.metrics``)."""
        return MetricSides()

    def timings(self) -> dict[str, float]:
        key = self.timing_key
        return {} if key is None or self.seconds is None else {key: self.seconds}

    def manifest_fields(self) -> dict[str, object]:
        """Manifest fields it fills: a mapping is merged into the field's, a list extends it."""
        return {}


class ReferenceResult(StageResult):
    timing_key: ClassVar[str | None] = "reference_s"

    key: str
    cached: bool
    baseline: dict[str, float] = Field(default_factory=dict)  # the baseline's ppl and token count

    def metric_values(self) -> MetricSides:
        return MetricSides(baseline=dict(self.baseline))

    def timings(self) -> dict[str, float]:
        return {} if self.cached else super().timings()

    def manifest_fields(self) -> dict[str, object]:
        return {"eval": {"reference_key": self.key, "reference_cached": self.cached}}


class QuantizeResult(StageResult):
    timing_key: ClassVar[str | None] = "quantize_s"

    artifact: ArtifactInfo

    def manifest_fields(self) -> dict[str, object]:
        return {"artifact": self.artifact}


class EvaluateResult(StageResult):
    timing_key: ClassVar[str | None] = "eval_s"

    metrics: dict[str, float]
    window_scores: WindowScores
    runtime: str
    kld_estimator: str | None = None
    tokenizer_check: str | None = None  # the artifact's own tokenizer against the baseline's
    deployment: DeploymentScore | None = None  # the eval text as the artifact's own tokenizer cuts it

    def metric_values(self) -> MetricSides:
        # bits per byte: the baseline's on the same text
        baseline = {} if self.deployment is None else {"bpb": self.deployment.baseline_bpb}
        return MetricSides(baseline=baseline, artifact=dict(self.metrics))

    def manifest_fields(self) -> dict[str, object]:
        keys = ("runtime", "kld_estimator", "tokenizer_check", "deployment")
        return {"eval": {key: getattr(self, key) for key in keys}}


class LmEvalResult(StageResult):
    timing_key: ClassVar[str | None] = "lm_eval_s"

    section: LmEvalSection
    recovered: dict[str, float]

    def metric_values(self) -> MetricSides:
        # per task; their mean (task_recovery_pct) is taken over every entry's (finalize)
        return MetricSides(artifact={f"task_recovery_pct:{task}": v for task, v in self.recovered.items()})

    def manifest_fields(self) -> dict[str, object]:
        return {"lm_eval": [self.section]}


class BenchResult(StageResult):
    timing_key: ClassVar[str | None] = "bench_s"

    section: BenchSection | BenchFailure
    baseline: dict[str, float] = Field(default_factory=dict)
    artifact: dict[str, float] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)

    def metric_values(self) -> MetricSides:
        return MetricSides(baseline=dict(self.baseline), artifact=dict(self.artifact))

    def manifest_fields(self) -> dict[str, object]:
        return {"bench": self.section}


class ServeBenchResult(StageResult):
    """Serving measurements (both sides kept) and the headline metrics of each side."""

    timing_key: ClassVar[str | None] = "serve_bench_s"

    section: ServeSection
    baseline: dict[str, float] = Field(default_factory=dict)
    artifact: dict[str, float] = Field(default_factory=dict)

    @classmethod
    def from_section(cls, section: ServeSection, seconds: float | None) -> ServeBenchResult:
        price = section.price_per_hour
        return cls(
            section=section,
            baseline={} if section.baseline is None else side_metrics(section.baseline, price),
            artifact={} if section.artifact is None else side_metrics(section.artifact, price),
            seconds=seconds,
        )

    def metric_values(self) -> MetricSides:
        return MetricSides(baseline=dict(self.baseline), artifact=dict(self.artifact))

    def manifest_fields(self) -> dict[str, object]:
        return {"serve": self.section}


class ServeEvalResult(StageResult):
    timing_key: ClassVar[str | None] = "serve_eval_s"

    quality: ServedQuality

    def metric_values(self) -> MetricSides:
        return MetricSides(artifact=dict(self.quality.metrics))

    def manifest_fields(self) -> dict[str, object]:
        return {"served_quality": self.quality}


R = TypeVar("R", bound=StageResult)


class RunResults:
    """The results of a run's stages by stage name (``lm_eval.N`` for each lm-eval entry)."""

    def __init__(self) -> None:
        self._results: dict[str, StageResult] = {}

    def put(self, name: str, result: StageResult) -> None:
        self._results[name] = result

    def drop(self, name: str) -> None:
        self._results.pop(name, None)

    def get(self, name: str, kind: type[R]) -> R | None:
        result = self._results.get(name)
        return result if isinstance(result, kind) else None

    def require(self, name: str, kind: type[R]) -> R:
        result = self.get(name, kind)
        if result is None:
            raise KeyError(f"stage '{name}' has no result")
        return result

    def items(self) -> Iterator[tuple[str, StageResult]]:
        """Every stage's result by name, lm-eval entries in their order."""
        return iter(sorted(self._results.items(), key=lambda item: _order(item[0])))

    def window_scores(self) -> WindowScores:
        """The run's per-window scores (the evaluation's)."""
        found = [result.window_scores for _, result in self.items() if isinstance(result, EvaluateResult)]
        if not found:
            raise KeyError("no stage has per-window scores")
        return found[0]

    def lm_eval(self) -> list[LmEvalResult]:
        """The lm-eval entries in order."""
        entries = [
            (int(name.split(".", 1)[1]), result)
            for name, result in self._results.items()
            if name.startswith("lm_eval.") and isinstance(result, LmEvalResult)
        ]
        return [result for _, result in sorted(entries, key=lambda item: item[0])]


def _order(name: str) -> tuple[str, int]:
    kind, _, index = name.partition(".")
    return kind, int(index) if index.isdigit() else -1
