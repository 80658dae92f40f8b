"""Runs stages against a run's journal: reuse what verifies, redo the rest, and drop what
depended on anything redone."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from quantkit.stages.base import StageFailed, kind_of
from quantkit.stages.results import StageResult
from quantkit.util.faults import failpoint
from quantkit.util.memory import release_freed_memory

if TYPE_CHECKING:
    from quantkit.stages.base import Stage
    from quantkit.stages.context import RunContext

R = TypeVar("R", bound=StageResult)


def depends_on(kind: str) -> tuple[str, ...]:
    """The kinds a stage kind uses the output of (from its registered class)."""
    from quantkit.stages import STAGES

    return STAGES.get(kind).depends_on


def dependents(kind: str, recorded: list[str]) -> list[str]:
    """Recorded stage names that use, directly or through others, the output of ``kind``."""
    doomed: set[str] = {kind}
    changed = True
    while changed:
        changed = False
        for name in recorded:
            if kind_of(name) not in doomed and doomed & set(depends_on(kind_of(name))):
                doomed.add(kind_of(name))
                changed = True
    return [name for name in recorded if kind_of(name) in doomed and kind_of(name) != kind]


class StageRunner:
    """Runs the stages of one run context, in the order they are given."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def run(self, stage: Stage[R], force: bool = False) -> R:
        """``stage``'s result: its verified record from an earlier attempt (unless ``force``),
        or a fresh run, after which every recorded stage that depended on it is dropped."""
        ctx = self.ctx
        if not force:
            data = ctx.journal.completed(stage.name, exact=stage.exact_folder(ctx))
            if data is not None:
                result = stage.parse(data)
                stage.reused(ctx, result)
                ctx.results.put(stage.name, result)
                return result
        stale = dependents(stage.kind, list(ctx.journal.stages))
        ctx.journal.forget(stage.name, *stale)
        for name in stale:
            ctx.results.drop(name)
        failpoint(f"before.{stage.kind}", _index(stage.name))
        try:
            output = stage.run(ctx)
        except StageFailed as failed:
            result = stage.parse(failed.result.model_dump(mode="json"))
            ctx.results.put(stage.name, result)
            return result
        finally:
            release_freed_memory()  # the next stage's model does not stack on this one's leftovers
        ctx.journal.complete(stage.name, output.result.model_dump(mode="json"), output.files)
        ctx.results.put(stage.name, output.result)
        return output.result


def _index(name: str) -> int | None:
    _, _, index = name.partition(".")
    return int(index) if index.isdigit() else None
