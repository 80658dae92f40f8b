"""The Stage interface: a name, the stages it depends on, ``run(ctx)`` and the files it makes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Generic, TypeAlias, TypeVar

from quantkit.stages.results import StageResult

if TYPE_CHECKING:
    from pydantic import JsonValue

    from quantkit.inputs.recipe import Recipe
    from quantkit.stages.context import RunContext

R_co = TypeVar("R_co", bound=StageResult, covariant=True)


@dataclass
class StageOutput(Generic[R_co]):
    """What a stage made: its result and the files the journal checksums for it."""

    result: R_co
    files: list[Path] = field(default_factory=list)


@dataclass(frozen=True)
class PlanInputs:
    """What decides the stages of a quantize run: its recipe, whether it benchmarks, its device."""

    recipe: Recipe
    bench: bool
    device: str


class StageFailed(Exception):
    """A stage that failed without failing the run (a benchmark that could not run): its
    result is shown in the run but not journaled, so a resume tries the stage again."""

    def __init__(self, result: StageResult) -> None:
        super().__init__(type(result).__name__)
        self.result = result


class Stage(ABC, Generic[R_co]):
    """One step of a run. ``name`` is unique in the run (``lm_eval.2``); ``kind`` is its
    registry name; ``depends_on`` names the kinds whose output it uses."""

    kind: ClassVar[str]
    depends_on: ClassVar[tuple[str, ...]] = ()
    result_type: ClassVar[type[StageResult]]  # its result's model (journal, manifest)

    @property
    def name(self) -> str:
        return self.kind

    @classmethod
    def planned(cls, inputs: PlanInputs) -> list[Stage[StageResult]]:
        """This stage's instances in a quantize run (default none: a stage a command adds, such
        as ``serve_bench``). A plug-in stage returns itself here to join every run."""
        return []

    def parse(self, data: dict[str, JsonValue]) -> R_co:
        """The typed result from its journal or manifest form."""
        result: R_co = self.result_type.model_validate(data)  # type: ignore[assignment]
        return result

    @abstractmethod
    def run(self, ctx: RunContext) -> StageOutput[R_co]:
        """Do the work (the runner records the result and checksums the files)."""

    def exact_folder(self, ctx: RunContext) -> Path | None:
        """A folder that must hold only this stage's recorded files for a reuse (the artifact)."""
        return None

    def reused(self, ctx: RunContext, result: StageResult) -> None:
        """Called when a recorded result is taken instead of running (to say so)."""
        return None


StageClass: TypeAlias = "type[Stage[StageResult]]"


def kind_of(stage_name: str) -> str:
    """The registry kind of a stage name (``lm_eval.2`` -> ``lm_eval``)."""
    return stage_name.split(".", 1)[0]
