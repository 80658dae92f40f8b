"""Evaluation: the artifact scored in its runtime on the eval windows, against the reference."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from quantkit.stages.base import PlanInputs, Stage, StageOutput
from quantkit.stages.results import EvaluateResult, QuantizeResult, StageResult

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from quantkit.evals.deployment import DeploymentScore, OwnWindows
    from quantkit.evals.quality import PositionScores
    from quantkit.evals.reference import Reference
    from quantkit.inputs.tokens import TokenWindows
    from quantkit.runtimes.base import OwnTokenizer, Runtime, RuntimeSettings
    from quantkit.stages.context import RunContext


class EvaluateStage(Stage[EvaluateResult]):
    """Perplexity, KLD, top-1 agreement and Δp of the artifact on the reference's windows,
    in the artifact's own runtime (or ``eval.runtime`` when the recipe names another)."""

    kind = "evaluate"
    depends_on = ("reference", "quantize")

    result_type = EvaluateResult

    @classmethod
    def planned(cls, inputs: PlanInputs) -> list[Stage[StageResult]]:
        return [cls()]

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
        from quantkit.runtimes import open_runtime, runtime_class
        from quantkit.runtimes.base import RuntimeSettings
        from quantkit.stages.reference import load_reference

        artifact = ctx.results.require("quantize", QuantizeResult).artifact
        kind = ctx.recipe.eval.runtime or artifact.runtime
        windows = ctx.tokens.eval_windows()
        reference = load_reference(ctx)
        start = time.perf_counter()
        own = runtime_class(kind).own_tokenizer(ctx.run.artifact_dir)
        check, cut = (None, None) if own is None else _own_tokenization(ctx, own, windows)
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
                wider = _wider(kind, ctx.run.artifact_dir, settings)
                deployment = None if cut is None else _deployment(runtime, wider, cut, scores, reference)
            finally:
                runtime.close()
        positions = scored_positions(ctx.recipe.eval.score, windows.seq_len)
        scores, reference = scores.at(positions), reference.at(positions)
        metrics = summarize(scores, baseline_metrics(reference, targets(windows, positions))["ppl"])
        result = EvaluateResult(
            metrics=metrics | ({} if deployment is None else deployment.metrics()),
            window_scores=per_window(scores, reference),
            runtime=kind,
            kld_estimator=estimator,
            tokenizer_check=check,
            deployment=deployment,
            seconds=round(time.perf_counter() - start, 3),
        )
        return StageOutput(result)


def _own_tokenization(ctx: RunContext, own: OwnTokenizer, windows: TokenWindows) -> tuple[str, OwnWindows]:
    """The artifact's own tokenizer checked against the baseline's on this run's eval and
    calibration texts and the stress text (a mismatch refuses the run unless
    ``eval.tokenizer_check`` is ``report``), and the eval windows as it cuts their text."""
    from quantkit.evals.deployment import own_windows
    from quantkit.inputs.tokenizer_check import TokenizerMismatchError, check_tokenization, stress_text

    tokenizer = ctx.tokens.tokenizer()
    texts = ctx.tokens.texts() | {"stress": stress_text(tokenizer)}
    try:
        try:
            passed = check_tokenization(tokenizer, own, texts, "the artifact's GGUF", _MISMATCH_HINT)
            verdict = "passed: " + ", ".join(f"{name} {count} tokens" for name, count in passed.texts.items())
        except TokenizerMismatchError as err:
            if ctx.recipe.eval.tokenizer_check == "refuse":
                raise
            ctx.reporter.log(f"warning: {err.message} (scored anyway: eval.tokenizer_check=report)")
            verdict = f"mismatch (reported): {err.message}"
        return verdict, own_windows(own, windows)
    finally:
        own.close()


_MISMATCH_HINT = (
    "its users would get other token ids than quantkit scores; evaluate a file of the same model and "
    "tokenizer, or set eval.tokenizer_check=report to score it anyway (the deployment-path score "
    "then shows the cost, and a gate fails)"
)


def _wider(kind: str, folder: Path, settings: RuntimeSettings) -> Callable[[int], Runtime | None]:
    """Opens the artifact again with a context of the given length, when that is longer than
    ``settings``' (None otherwise: the open runtime has room)."""
    from dataclasses import replace

    from quantkit.runtimes import open_runtime

    def open_wider(context: int) -> Runtime | None:
        if context <= settings.context_length:
            return None
        return open_runtime(kind, folder, replace(settings, context_length=context))

    return open_wider


def _deployment(
    runtime: Runtime,
    wider: Callable[[int], Runtime | None],
    cut: OwnWindows,
    scores: PositionScores,
    reference: Reference,
) -> DeploymentScore:
    """The deployment-path score: only the windows the file cuts differently are scored again,
    in ``runtime`` or, when the longest of them does not fit, in ``wider(its length)``."""
    from quantkit.evals.deployment import deployment_score, window_nll

    differ = [i for i, same in enumerate(cut.same) if not same]
    own_nll: dict[int, float] = {}
    if differ:
        wide = wider(max(len(cut.ids[i]) for i in differ))
        try:
            own_nll = {i: window_nll(wide or runtime, cut.ids[i]) for i in differ}
        finally:
            if wide is not None:
                wide.close()
    baseline_nll = -reference.target_logprobs.astype("float64").sum(-1)
    return deployment_score(cut, scores.nll.sum(-1), baseline_nll, own_nll)
