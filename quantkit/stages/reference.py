"""The baseline reference: top-k log-probs per eval position, computed once and cached."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quantkit.stages.base import PlanInputs, Stage, StageOutput
from quantkit.stages.results import ReferenceResult, StageResult

if TYPE_CHECKING:
    from quantkit.device import BaselineDtype
    from quantkit.evals.reference import Reference
    from quantkit.inputs.models import ModelSource
    from quantkit.inputs.recipe import Recipe
    from quantkit.stages.context import RunContext, Tokens
    from quantkit.util.progress import Reporter


@dataclass(frozen=True)
class BaselineInputs:
    """What the baseline reference depends on: the eval settings, the model, the device and
    the baseline's precision there."""

    recipe: Recipe
    source: ModelSource
    device: str
    tokens: Tokens
    trust_remote_code: bool = False

    @classmethod
    def of(cls, ctx: RunContext) -> BaselineInputs:
        return cls(ctx.recipe, ctx.source, ctx.device, ctx.tokens, ctx.settings.trust_remote_code)

    @property
    def dtype(self) -> BaselineDtype:
        from quantkit.device import baseline_dtype

        return baseline_dtype(self.device, self.recipe.baseline.dtype)

    def reference_key(self) -> str:
        from quantkit.evals import reference as ref

        windows, spec = self.tokens.eval_windows(), self.recipe.eval
        fingerprint = self.source.fingerprint()
        return ref.reference_key(
            fingerprint, windows, spec.top_k, self.device, spec.tail_samples, dtype=self.dtype
        )


def reference_key(ctx: RunContext) -> str:
    return BaselineInputs.of(ctx).reference_key()


def load_reference(ctx: RunContext) -> Reference:
    """The cached reference of this run (the reference stage has run)."""
    from quantkit.errors import QuantkitError
    from quantkit.evals import reference as ref

    key = ctx.results.require("reference", ReferenceResult).key
    cached = ref.load_cached(key)
    if cached is None:
        raise QuantkitError(f"the baseline reference {key} vanished from the cache", "run the command again")
    return cached


def ensure_reference(inputs: BaselineInputs, reporter: Reporter) -> tuple[Reference, float | None]:
    """The cached reference of a model, eval windows, device and precision, computed now when absent;
    with the seconds it took (None: it was cached)."""
    from quantkit.evals import reference as ref
    from quantkit.util.fileio import cache_entry_lock

    key = inputs.reference_key()
    cached = ref.load_cached(key)
    if cached is not None:
        return cached, None
    with cache_entry_lock(ref.cache_path(key)):  # another process may be computing it: wait, reuse
        cached = ref.load_cached(key)
        if cached is not None:
            return cached, None
        return _compute_reference(inputs, key, reporter)


def _compute_reference(inputs: BaselineInputs, key: str, reporter: Reporter) -> tuple[Reference, float]:
    from quantkit.evals import reference as ref
    from quantkit.runtimes.base import RuntimeSettings
    from quantkit.runtimes.hf import HFRuntime

    windows = inputs.tokens.eval_windows()
    start = time.perf_counter()
    with reporter.stage("baseline reference", total=len(windows.ids)) as advance:
        settings = RuntimeSettings(
            device=inputs.device,
            context_length=windows.seq_len,
            trust_remote_code=inputs.trust_remote_code,
            dtype=inputs.dtype,
        )
        runtime = HFRuntime.load(inputs.source.path, settings)
        spec = inputs.recipe.eval
        shape = ref.ReferenceShape(spec.top_k, spec.batch_size, spec.tail_samples)
        reference = ref.compute(runtime, windows, shape, key, advance)
        runtime.close()
    ref.save(reference)
    return reference, round(time.perf_counter() - start, 3)


class ReferenceStage(Stage[ReferenceResult]):
    """Scores the eval windows with the unquantized model (transformers, in the baseline's
    precision) and caches the compact top-k reference; reused from the cache when present."""

    kind = "reference"

    result_type = ReferenceResult

    @classmethod
    def planned(cls, inputs: PlanInputs) -> list[Stage[StageResult]]:
        return [cls()]

    def run(self, ctx: RunContext) -> StageOutput[ReferenceResult]:
        from quantkit.evals import reference as ref
        from quantkit.evals.quality import baseline_metrics, scored_positions, targets

        windows = ctx.tokens.eval_windows()
        positions = scored_positions(ctx.recipe.eval.score, windows.seq_len)
        reference, seconds = ensure_reference(BaselineInputs.of(ctx), ctx.reporter)
        if seconds is None:
            ctx.reporter.log(f"baseline reference: cached ({reference.key[:12]})")
        result = ReferenceResult(
            key=reference.key,
            cached=seconds is None,
            baseline=baseline_metrics(reference.at(positions), targets(windows, positions)),
            seconds=seconds,
        )
        _guard(ctx, result)  # the reference stays cached: --allow-implausible-baseline reuses it
        return StageOutput(result, [ref.cache_path(reference.key)])

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
