"""The baseline reference: top-k log-probs per eval position, computed once and cached."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from quantkit.stages.base import Stage, StageOutput
from quantkit.stages.results import ReferenceResult, StageResult

if TYPE_CHECKING:
    from pydantic import JsonValue

    from quantkit.evals.reference import Reference
    from quantkit.stages.context import RunContext


def reference_key(ctx: RunContext) -> str:
    from quantkit.evals import reference as ref

    windows, spec = ctx.tokens.eval_windows(), ctx.recipe.eval
    return ref.reference_key(ctx.source.fingerprint(), windows, spec.top_k, ctx.device, spec.tail_samples)


def load_reference(ctx: RunContext) -> Reference:
    """The cached reference of this run (the reference stage has run)."""
    from quantkit.errors import QuantkitError
    from quantkit.evals import reference as ref

    key = ctx.results.require("reference", ReferenceResult).key
    cached = ref.load_cached(key)
    if cached is None:
        raise QuantkitError(f"the baseline reference {key} vanished from the cache", "run the command again")
    return cached


class ReferenceStage(Stage[ReferenceResult]):
    """Scores the eval windows with the unquantized model (transformers, in the baseline's
    precision) and caches the compact top-k reference; reused from the cache when present."""

    kind = "reference"

    def parse(self, data: dict[str, JsonValue]) -> ReferenceResult:
        return ReferenceResult.model_validate(data)

    def run(self, ctx: RunContext) -> StageOutput[ReferenceResult]:
        from quantkit.evals import reference as ref
        from quantkit.evals.quality import baseline_metrics, scored_positions, targets
        from quantkit.runtimes.base import RuntimeSettings
        from quantkit.runtimes.hf import HFRuntime

        key = reference_key(ctx)
        cached = ref.load_cached(key)
        windows = ctx.tokens.eval_windows()
        positions = scored_positions(ctx.recipe.eval.score, windows.seq_len)
        if cached is not None:
            ctx.reporter.log(f"baseline reference: cached ({key[:12]})")
            baseline = baseline_metrics(cached.at(positions), targets(windows, positions))
            result = ReferenceResult(key=key, cached=True, baseline=baseline)
            _guard(ctx, result)
            return StageOutput(result, [ref.cache_path(key)])
        start = time.perf_counter()
        with ctx.reporter.stage("baseline reference", total=len(windows.ids)) as advance:
            settings = RuntimeSettings(
                device=ctx.device,
                context_length=windows.seq_len,
                trust_remote_code=ctx.settings.trust_remote_code,
            )
            runtime = HFRuntime.load(ctx.source.path, settings)
            spec = ctx.recipe.eval
            shape = ref.ReferenceShape(spec.top_k, spec.batch_size, spec.tail_samples)
            reference = ref.compute(runtime, windows, shape, key, advance)
            runtime.close()
        path = ref.save(reference)
        result = ReferenceResult(
            key=key,
            cached=False,
            baseline=baseline_metrics(reference.at(positions), targets(windows, positions)),
            seconds=round(time.perf_counter() - start, 3),
        )
        _guard(ctx, result)  # the reference stays cached: --allow-implausible-baseline reuses it
        return StageOutput(result, [path])

    def reused(self, ctx: RunContext, result: StageResult) -> None:
        if isinstance(result, ReferenceResult):
            ctx.reporter.log(f"baseline reference: cached ({result.key[:12]})")
            _guard(ctx, result)


def _guard(ctx: RunContext, result: ReferenceResult) -> None:
    """The baseline sanity guard: an implausible baseline stops the run before quantizing."""
    from quantkit.evals.plausibility import check_baseline, plausibility

    check = plausibility(result.baseline)
    if check is None:
        return
    check_baseline(check, ctx.settings.allow_implausible_baseline)
    if not check.plausible:
        ctx.reporter.log("the baseline is implausible; going on (--allow-implausible-baseline)")
