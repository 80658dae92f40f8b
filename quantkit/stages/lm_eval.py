"""lm-eval tasks on the baseline (cached) and the artifact: one stage per ``evals`` entry."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from quantkit.stages.base import PlanInputs, Stage, StageOutput
from quantkit.stages.results import LmEvalResult, QuantizeResult, StageResult

if TYPE_CHECKING:
    from quantkit.inputs.specs import LmEvalSpec
    from quantkit.stages.context import RunContext


def samples_dir(run_folder: Path, index: int) -> Path:
    """Where entry ``index`` keeps lm-eval's per-sample logs (``lm_eval/``, ``lm_eval/entry-N/``)."""
    return run_folder / "lm_eval" if index == 0 else run_folder / "lm_eval" / f"entry-{index}"


class LmEvalStage(Stage[LmEvalResult]):
    """Entry ``index`` of the recipe's ``evals``: its tasks on the baseline and the artifact."""

    kind = "lm_eval"
    depends_on = ("quantize",)

    def __init__(self, index: int, spec: LmEvalSpec) -> None:
        self.index = index
        self.spec = spec

    @property
    def name(self) -> str:
        return f"{self.kind}.{self.index}"

    result_type = LmEvalResult

    @classmethod
    def planned(cls, inputs: PlanInputs) -> list[Stage[StageResult]]:
        return [cls(index, entry.lm_eval) for index, entry in enumerate(inputs.recipe.evals)]

    def run(self, ctx: RunContext) -> StageOutput[LmEvalResult]:
        from quantkit.evals import lm_eval_runner as runner
        from quantkit.results.manifest import LmEvalSection
        from quantkit.runtimes.base import RuntimeSettings

        spec = self.spec
        logs = samples_dir(ctx.run.folder, self.index)
        for task in spec.tasks:  # a half-written log of an interrupted attempt
            (logs / f"{task}.jsonl").unlink(missing_ok=True)
        artifact = ctx.results.require("quantize", QuantizeResult).artifact
        settings = RuntimeSettings(
            device=ctx.device, trust_remote_code=ctx.settings.trust_remote_code, dtype=ctx.dtype
        )
        start = time.perf_counter()
        names = ", ".join(spec.tasks)
        runner.check_tasks(spec.tasks)
        with ctx.reporter.stage(f"lm-eval {names}: baseline"):
            base, cached = runner.baseline(ctx.source.path, ctx.source.fingerprint(), settings, spec)
        with ctx.reporter.stage(f"lm-eval {names}: artifact"):
            quant = runner.evaluate_in(artifact.runtime, ctx.run.artifact_dir, settings, spec, logs)
        section = LmEvalSection(settings=spec, baseline=base, baseline_cached=cached, artifact=quant)
        result = LmEvalResult(
            section=section,
            recovered=runner.recovery(base, quant),
            seconds=round(time.perf_counter() - start, 3),
        )
        files = [logs / f"{task}.jsonl" for task in spec.tasks]
        return StageOutput(result, [path for path in files if path.is_file()])
