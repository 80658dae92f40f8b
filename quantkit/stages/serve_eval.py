"""Quality through an endpoint: the run's eval windows scored by the server's prompt
log-probs against the run's cached reference (ppl, KLD with the top-k + rest estimator,
top-1 agreement), after the alignment self-check (``quantkit.serving.scoring``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from quantkit.stages.base import Stage, StageOutput
from quantkit.stages.results import ServeEvalResult

if TYPE_CHECKING:
    from quantkit.serving.endpoint import Endpoint
    from quantkit.stages.context import RunContext

DEFAULT_TOP_LOGPROBS = 20  # vLLM's default --max-logprobs


class ServeEvalStage(Stage[ServeEvalResult]):
    """Score the run's windows through ``endpoint`` asking for ``top_k`` log-probs per position."""

    kind = "serve_eval"
    depends_on = ("reference", "quantize")

    def __init__(self, endpoint: Endpoint, top_k: int | None) -> None:
        self.endpoint = endpoint
        self.top_k = top_k

    result_type = ServeEvalResult

    def run(self, ctx: RunContext) -> StageOutput[ServeEvalResult]:
        import numpy as np

        from quantkit.evals.quality import baseline_metrics, score, scored_positions, summarize, targets
        from quantkit.run.finalize import now
        from quantkit.runtimes.base import ScoreRequest
        from quantkit.serving.endpoint import describe
        from quantkit.serving.record import ServedQuality
        from quantkit.serving.scoring import EndpointScorer, check_alignment
        from quantkit.stages.reference import load_reference

        start = time.perf_counter()
        info = describe(self.endpoint)
        windows = ctx.tokens.eval_windows()
        reference = load_reference(ctx)
        top_k = self.top_k or min(reference.top_k, DEFAULT_TOP_LOGPROBS)
        scorer = EndpointScorer(self.endpoint, info, ctx.tokens.tokenizer(), top_k)
        try:
            with ctx.reporter.stage(f"self-check of {info.url}'s prompt log-probs"):
                first = scorer.score(ScoreRequest(ids=np.asarray(windows.ids[:1]), top_k=top_k))
                found = check_alignment(first, reference, slice(0, 1), info.url)
            title = f"scoring the eval windows through {info.url} ({info.model})"
            with ctx.reporter.stage(title, total=len(windows.ids)) as advance:
                scores = score(scorer, windows, reference, ctx.recipe.eval.batch_size, advance)
        finally:
            scorer.close()
        positions = scored_positions(ctx.recipe.eval.score, windows.seq_len)
        scores, reference = scores.at(positions), reference.at(positions)
        values = summarize(scores, baseline_metrics(reference, targets(windows, positions))["ppl"])
        keep = ("ppl", "ppl_increase_pct", "kld_mean", "kld_p99", "top1_agreement_pct")
        quality = ServedQuality(
            server=info,
            protocol=scorer.protocol or "",
            top_k=top_k,
            alignment={"early": found.early, "aligned": found.aligned, "late": found.late},
            metrics={f"served_{name}": values[name] for name in keep},
            measured_at=now(),
        )
        return StageOutput(ServeEvalResult(quality=quality, seconds=round(time.perf_counter() - start, 3)))
