"""Evaluation: the artifact scored in its runtime on the eval windows, against the reference."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from quantkit.stages.base import Stage, StageOutput
from quantkit.stages.results import EvaluateResult, QuantizeResult

if TYPE_CHECKING:
    from pydantic import JsonValue

    from quantkit.stages.context import RunContext


class EvaluateStage(Stage[EvaluateResult]):
    """Perplexity, KLD, top-1 agreement and Δp of the artifact on the reference's windows,
    in the artifact's own runtime (or ``eval.runtime`` when the recipe names another)."""

    kind = "evaluate"
    depends_on = ("reference", "quantize")

    def parse(self, data: dict[str, JsonValue]) -> EvaluateResult:
        return EvaluateResult.model_validate(data)

    def run(self, ctx: RunContext) -> StageOutput[EvaluateResult]:
        from quantkit.evals.quality import (
            baseline_metrics,
            kld_estimator,
            per_window,
            score,
            scored_positions,
            summarize,
            targets,
        )
        from quantkit.runtimes import open_runtime
        from quantkit.runtimes.base import RuntimeSettings
        from quantkit.stages.reference import load_reference

        artifact = ctx.results.require("quantize", QuantizeResult).artifact
        kind = ctx.recipe.eval.runtime or artifact.runtime
        windows = ctx.tokens.eval_windows()
        reference = load_reference(ctx)
        start = time.perf_counter()
        with ctx.reporter.stage("evaluating the artifact", total=len(windows.ids)) as advance:
            settings = RuntimeSettings(
                device=ctx.device,
                context_length=windows.seq_len,
                trust_remote_code=ctx.settings.trust_remote_code,
                dtype=ctx.dtype,  # the baseline's precision: the delta is the quantization's alone
            )
            runtime = open_runtime(kind, ctx.run.artifact_dir, settings)
            try:
                scores = score(runtime, windows, reference, ctx.recipe.eval.batch_size, advance)
                estimator = kld_estimator(runtime, reference)
            finally:
                runtime.close()
        positions = scored_positions(ctx.recipe.eval.score, windows.seq_len)
        scores, reference = scores.at(positions), reference.at(positions)
        result = EvaluateResult(
            metrics=summarize(scores, baseline_metrics(reference, targets(windows, positions))["ppl"]),
            window_scores=per_window(scores, reference),
            runtime=kind,
            kld_estimator=estimator,
            seconds=round(time.perf_counter() - start, 3),
        )
        return StageOutput(result)
