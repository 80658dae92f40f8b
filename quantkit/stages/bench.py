"""Speed and memory of the baseline and the artifact (and the unquantized model in the
artifact's runtime), each in a fresh process. A failure is recorded, not fatal."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from quantkit.stages.base import PlanInputs, Stage, StageFailed, StageOutput
from quantkit.stages.results import BenchResult, QuantizeResult, StageResult

if TYPE_CHECKING:
    from quantkit.evals.perf import SharedSides
    from quantkit.inputs.specs import BenchSpec
    from quantkit.stages.context import RunContext


class BenchStage(Stage[BenchResult]):
    """Benchmarks with ``spec`` (the recipe's ``bench:``, or the command's overrides) on
    ``device`` (the run's, unless ``quantkit bench --device`` names another)."""

    kind = "bench"
    depends_on = ("quantize",)

    def __init__(self, spec: BenchSpec, device: str) -> None:
        self.spec = spec
        self.device = device

    result_type = BenchResult

    @classmethod
    def planned(cls, inputs: PlanInputs) -> list[Stage[StageResult]]:
        return [cls(inputs.recipe.bench, inputs.device)] if inputs.bench else []

    def run(self, ctx: RunContext) -> StageOutput[BenchResult]:
        from quantkit.device import baseline_dtype
        from quantkit.errors import BackendError
        from quantkit.evals import perf
        from quantkit.results.manifest import BenchFailure

        artifact = ctx.results.require("quantize", QuantizeResult).artifact
        dtype = baseline_dtype(self.device, ctx.recipe.baseline.dtype)  # on the bench's device
        start = time.perf_counter()
        with ctx.reporter.stage("benchmarking speed and memory (baseline, artifact)"):
            same_runtime = ctx.backend.runtime_baseline(ctx.source.path, ctx.reporter.log)
            try:
                section = perf.measure(
                    perf.BenchTarget(ctx.source.path, "hf", dtype),
                    perf.BenchTarget(ctx.run.artifact_dir, artifact.runtime, dtype),
                    None if same_runtime is None else perf.BenchTarget(same_runtime, artifact.runtime, dtype),
                    self.device,
                    self.spec,
                    _shared_sides(ctx),
                )
            except BackendError as err:  # shown in the run, not journaled: a resume tries again
                ctx.reporter.log(f"benchmark failed: {err.message}")
                raise StageFailed(BenchResult(section=BenchFailure(error=err.message))) from None
        base, quant, notes = perf.metrics_from(section, self.spec)
        caveat = ctx.backend.speed_caveat(self.device)
        notes = notes if caveat is None else [caveat, *notes]
        section.notes = notes
        result = BenchResult(
            section=section,
            baseline=base,
            artifact=quant,
            notes=notes,
            seconds=round(time.perf_counter() - start, 3),
        )
        return StageOutput(result)


def _shared_sides(ctx: RunContext) -> SharedSides | None:
    from quantkit.evals.perf import SharedSides

    folder = ctx.settings.shared_baseline
    return None if folder is None else SharedSides(folder)
