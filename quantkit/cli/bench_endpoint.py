"""`quantkit bench --endpoint URL [RUN...]`: latency and throughput under load through an
OpenAI-compatible server; with runs, stored in each run (its artifact, or ``--side baseline``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from quantkit.cli.output import OutputFormat, RichReporter, emit_json, stderr, stdout
from quantkit.errors import UserInputError

if TYPE_CHECKING:
    from collections.abc import Callable

    from quantkit.results.store import RunRecord
    from quantkit.serving.endpoint import Endpoint, ServerInfo
    from quantkit.serving.loadgen import LoadSpec
    from quantkit.serving.record import ServeSideName
    from quantkit.serving.stats import LevelResult


@dataclass(frozen=True)
class EndpointFlags:
    """The --endpoint flags of quantkit bench, as typed."""

    url: str
    served_model: str | None
    api_key: str | None
    concurrency: str
    request_rate: float | None
    requests: int
    max_tokens: int
    prompt_lengths: str
    slo: str | None
    side: str
    timeout: str
    max_level_time: str
    price_per_hour: float | None
    tokenizer: str

    def plan(self) -> EndpointPlan:
        """Every flag checked (exit 2 on any) before a request is sent."""
        from pydantic import ValidationError

        from quantkit.serving.endpoint import Endpoint, check_url
        from quantkit.serving.loadgen import LoadSpec
        from quantkit.serving.stats import Slo
        from quantkit.serving.units import parse_counts, parse_duration, parse_slo

        if self.side not in ("artifact", "baseline"):
            raise UserInputError(f"--side: '{self.side}' is not artifact or baseline", "--side baseline")
        if self.price_per_hour is not None and self.price_per_hour <= 0:
            raise UserInputError("--price-per-hour must be positive", "e.g. --price-per-hour 4.5")
        timeout_s = parse_duration(self.timeout, "--timeout")
        try:
            spec = LoadSpec(
                concurrency=parse_counts(self.concurrency, "--concurrency"),
                request_rate=self.request_rate,
                requests=self.requests,
                max_tokens=self.max_tokens,
                prompt_lengths=parse_counts(self.prompt_lengths, "--prompt-lengths"),
                slo=parse_slo(self.slo) if self.slo is not None else Slo(),
                timeout_s=timeout_s,
                max_level_s=parse_duration(self.max_level_time, "--max-level-time"),
            )
        except ValidationError as err:
            first = err.errors()[0]
            flag = "--" + ".".join(str(part) for part in first["loc"]).replace("_", "-")
            raise UserInputError(f"{flag}: {first['msg']}", "see quantkit bench --help") from None
        endpoint = Endpoint(
            url=check_url(self.url),
            model=self.served_model,
            api_key=self.api_key or "EMPTY",
            timeout_s=timeout_s,
        )
        side: ServeSideName = "baseline" if self.side == "baseline" else "artifact"
        return EndpointPlan(endpoint, spec, side, self.price_per_hour, self.tokenizer)


@dataclass(frozen=True)
class EndpointPlan:
    """A checked endpoint measurement: where, what load, which side, at what price."""

    endpoint: Endpoint
    spec: LoadSpec
    side: ServeSideName
    price_per_hour: float | None
    tokenizer: str


def bench_endpoint(runs: list[Path], plan: EndpointPlan, output_format: OutputFormat) -> None:
    """Measure the endpoint; store it in the runs when given (checked before any request)."""
    from quantkit.serving.endpoint import describe

    records = _runs(runs)
    endpoint, spec = plan.endpoint, plan.spec
    if not records:
        from quantkit.serving.loadgen import check_answered, run_load
        from quantkit.serving.prompts import default_pools

        info = describe(endpoint)
        pools, _ = default_pools(plan.tokenizer, spec.prompt_lengths, spec.seed)
        if output_format == OutputFormat.human:
            stderr.print(f"loading {escape(info.url)} ({escape(info.model)})")
        levels = run_load(endpoint, info.model, pools, spec, _announce(output_format))
        check_answered(levels, info.url)
        _show([("", plan.side, info, levels)], plan.price_per_hour, output_format)
        return
    from quantkit.run.pipeline import serve_bench_run

    shown: list[tuple[str, str, ServerInfo, list[LevelResult]]] = []
    for record in records:
        if output_format == OutputFormat.human:
            stderr.print(f"loading {escape(endpoint.url)} as {escape(record.name)}'s {plan.side}")
        reporter = RichReporter() if output_format == OutputFormat.human else None
        updated = serve_bench_run(record, endpoint, spec, plan.side, plan.price_per_hour, reporter).record
        serve = updated.manifest.serve
        measured = None if serve is None else serve.side(plan.side)
        if measured is not None:
            shown.append((str(updated.path), plan.side, measured.server, measured.levels))
    _show(shown, plan.price_per_hour, output_format)


def _runs(paths: list[Path]) -> list[RunRecord]:
    from quantkit.results.store import load_run

    return [load_run(path) for path in paths]


def _announce(output_format: OutputFormat) -> Callable[[LevelResult], None]:
    def show(level: LevelResult) -> None:
        if output_format == OutputFormat.human:
            stderr.print(f"  {level.label}: {level.completed}/{level.requests} completed")

    return show


def _show(
    rows: list[tuple[str, str, ServerInfo, list[LevelResult]]],
    price: float | None,
    output_format: OutputFormat,
) -> None:
    from rich.table import Table

    from quantkit.metrics import format_number

    if output_format == OutputFormat.json:
        emit_json(
            [
                {
                    "run": run or None,
                    "side": side,
                    "server": info.model_dump(mode="json"),
                    "levels": [level.model_dump(mode="json") for level in levels],
                }
                for run, side, info, levels in rows
            ]
        )
        return
    table = Table(title="serving under load (client-side; percentiles over completed requests)")
    columns = ("run", "load", "ok/sent", "req/s", "out tok/s", "TTFT p50", "TTFT p95", "TPOT p95")
    for column in (*columns, "ITL p95", "E2E p95", "goodput"):
        table.add_column(column, justify="left" if column in ("run", "load") else "right")

    def ms(value: float | None) -> str:
        return "—" if value is None else f"{1000 * value:.0f} ms"

    for run, side, _info, levels in rows:
        label = escape(f"{Path(run).name} ({side})" if run else side)
        for level in levels:
            table.add_row(
                label,
                level.label,
                f"{level.completed}/{level.requests}",
                format_number("tok_s", level.request_throughput),
                format_number("tok_s", level.output_tok_s),
                ms(level.ttft.p50),
                ms(level.ttft.p95),
                ms(level.tpot.p95),
                ms(level.itl.p95),
                ms(level.e2e.p95),
                "—" if level.goodput is None else f"{100 * level.goodput:.0f}%",
            )
    stdout.print(table)
    for _run, _side, _info, levels in rows:
        for level in levels:
            for reason, count in level.errors.items():
                stderr.print(f"[yellow]failed:[/yellow] {level.label}: {count} x {escape(reason)}")
    if price is not None:
        from quantkit.serving.record import headline, level_cost

        for run, _side, _info, levels in rows:
            top = headline(levels)
            cost = level_cost(top, price)
            if cost:
                where = f" ({escape(Path(run).name)})" if run else ""
                stderr.print(
                    f"cost at {top.label}{where}: ${cost['serve_cost_per_request_usd']:.3g} per request, "
                    f"${cost['serve_cost_per_mtok_usd']:.3g} per 1M output tokens"
                )
