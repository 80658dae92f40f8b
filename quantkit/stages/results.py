"""What each stage records: typed results, stored in the journal and rebuilt from manifests."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

from quantkit.evals.deployment import DeploymentScore
from quantkit.manifest import ArtifactInfo, BenchFailure, BenchSection, LmEvalSection
from quantkit.serving.record import ServedQuality, ServeSection, side_metrics
from quantkit.window_scores import WindowScores


class StageResult(BaseModel):
    """Base of stage results: strict, and with the seconds the stage took (None: reused)."""

    model_config = ConfigDict(extra="forbid")

    seconds: float | None = None


class ReferenceResult(StageResult):
    key: str
    cached: bool
    baseline: dict[str, float] = Field(default_factory=dict)  # the baseline's ppl and token count


class QuantizeResult(StageResult):
    artifact: ArtifactInfo


class EvaluateResult(StageResult):
    metrics: dict[str, float]
    window_scores: WindowScores
    runtime: str
    kld_estimator: str | None = None
    tokenizer_check: str | None = None  # the artifact's own tokenizer against the baseline's
    deployment: DeploymentScore | None = None  # the eval text as the artifact's own tokenizer cuts it


class LmEvalResult(StageResult):
    section: LmEvalSection
    recovered: dict[str, float]


class BenchResult(StageResult):
    section: BenchSection | BenchFailure
    baseline: dict[str, float] = Field(default_factory=dict)
    artifact: dict[str, float] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)


class ServeBenchResult(StageResult):
    """Serving measurements (both sides kept) and the headline metrics of each side."""

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


class ServeEvalResult(StageResult):
    quality: ServedQuality


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

    def lm_eval(self) -> list[LmEvalResult]:
        """The lm-eval entries in order."""
        entries = [
            (int(name.split(".", 1)[1]), result)
            for name, result in self._results.items()
            if name.startswith("lm_eval.") and isinstance(result, LmEvalResult)
        ]
        return [result for _, result in sorted(entries, key=lambda item: item[0])]
