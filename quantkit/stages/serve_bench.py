"""Latency under load through an OpenAI-compatible endpoint serving the run's artifact (or its
baseline): the run keeps both sides, so measuring one keeps the other's last measurement."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from quantkit.stages.base import Stage, StageOutput
from quantkit.stages.results import ServeBenchResult

if TYPE_CHECKING:
    from quantkit.serving.endpoint import Endpoint
    from quantkit.serving.loadgen import LoadSpec
    from quantkit.serving.record import ServeSideName
    from quantkit.stages.context import RunContext


class ServeBenchStage(Stage[ServeBenchResult]):
    """Load ``endpoint`` with ``spec`` and record it as the run's ``side``."""

    kind = "serve_bench"
    depends_on = ("quantize",)

    def __init__(
        self, endpoint: Endpoint, spec: LoadSpec, side: ServeSideName, price_per_hour: float | None
    ) -> None:
        self.endpoint = endpoint
        self.spec = spec
        self.side = side
        self.price_per_hour = price_per_hour

    result_type = ServeBenchResult

    def run(self, ctx: RunContext) -> StageOutput[ServeBenchResult]:
        from quantkit.run.finalize import now
        from quantkit.serving.endpoint import describe
        from quantkit.serving.loadgen import check_answered, run_load
        from quantkit.serving.prompts import prompt_pools
        from quantkit.serving.record import ServeSection, ServeSide

        start = time.perf_counter()
        info = describe(self.endpoint)
        windows = ctx.tokens.eval_windows()
        tokenizer = ctx.tokens.tokenizer()
        bos = tokenizer.bos_token_id
        pools = prompt_pools(tokenizer, windows.ids, self.spec.prompt_lengths, self.spec.seed, bos)
        title = f"serving load on {info.url} ({info.model}, {self.side})"
        with ctx.reporter.stage(title, total=len(self.spec.concurrency)) as advance:
            levels = run_load(self.endpoint, info.model, pools, self.spec, lambda _: advance(1))
        check_answered(levels, info.url)
        side = ServeSide(
            server=info,
            settings=self.spec,
            levels=levels,
            measured_at=now(),
            prompts=f"the run's eval text (windows {windows.hash[:12]}), the baseline's tokenizer",
        )
        previous = ctx.results.get("serve_bench", ServeBenchResult)
        section = previous.section.model_copy() if previous is not None else ServeSection()
        setattr(section, self.side, side)
        if self.price_per_hour is not None:
            section.price_per_hour = self.price_per_hour
        result = ServeBenchResult.from_section(section, seconds=round(time.perf_counter() - start, 3))
        return StageOutput(result)
