"""`quantkit bench RUN...`: measure (again) speed and memory of runs and their baseline."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from quantkit.cli.common import FormatOption, VerboseOption, device_option, device_value
from quantkit.cli.output import OutputFormat, RichReporter, emit_json, stderr, stdout
from quantkit.device import DeviceChoice
from quantkit.errors import UserInputError


def bench(
    runs: list[Path] = typer.Argument(
        None, help="run folders made by quantkit quantize (optional with --endpoint)", metavar="RUN"
    ),
    price_per_hour: float | None = typer.Option(
        None, "--price-per-hour", help="USD per device-hour, for cost"
    ),
    repeats: int | None = typer.Option(None, "--repeats", help="timings per setting (median)"),
    device: DeviceChoice | None = device_option("the run's"),
    endpoint: str | None = typer.Option(
        None, "--endpoint", help="an OpenAI-compatible server's base URL: measure latency under load there"
    ),
    served_model: str | None = typer.Option(
        None, "--served-model", help="with --endpoint: the model name to request (default: the one it lists)"
    ),
    api_key: str | None = typer.Option(
        None, "--api-key", envvar="OPENAI_API_KEY", help="with --endpoint: the server's API key"
    ),
    concurrency: str = typer.Option("1,4", "--concurrency", help="with --endpoint: load levels, e.g. 1,4,16"),
    request_rate: float | None = typer.Option(
        None, "--request-rate", help="with --endpoint: requests/s with Poisson arrivals instead of levels"
    ),
    requests: int = typer.Option(32, "--requests", help="with --endpoint: requests per load level"),
    max_tokens: int = typer.Option(64, "--max-tokens", help="with --endpoint: output tokens per request"),
    prompt_lengths: str = typer.Option(
        "128", "--prompt-lengths", help="with --endpoint: prompt lengths in tokens, e.g. 128,512"
    ),
    slo: str | None = typer.Option(
        None, "--slo", help="with --endpoint: per-request objectives for goodput, e.g. ttft=500ms,tpot=50ms"
    ),
    side: str = typer.Option(
        "artifact",
        "--side",
        help="with --endpoint and runs: the server serves the run's artifact or baseline",
    ),
    timeout: str = typer.Option(
        "60s", "--timeout", help="with --endpoint: longest wait for a response's next data"
    ),
    max_level_time: str = typer.Option(
        "600s", "--max-level-time", help="with --endpoint: a load level stops by itself after this"
    ),
    tokenizer: str = typer.Option(
        "smollm2-135m", "--tokenizer", help="with --endpoint and no run: whose tokens prompt lengths count"
    ),
    output_format: OutputFormat = FormatOption,
    verbose: bool = VerboseOption,
) -> None:
    """Benchmark each run's artifact and its baseline side by side, in process; or, with
    --endpoint, latency and throughput under load through a server (stored in the runs given)."""
    runs = runs or []
    if endpoint is not None:
        from quantkit.cli.bench_endpoint import EndpointFlags, bench_endpoint

        flags = EndpointFlags(
            url=endpoint, served_model=served_model, api_key=api_key, concurrency=concurrency,
            request_rate=request_rate, requests=requests, max_tokens=max_tokens,
            prompt_lengths=prompt_lengths, slo=slo, side=side, timeout=timeout,
            max_level_time=max_level_time, price_per_hour=price_per_hour, tokenizer=tokenizer,
        )  # fmt: skip
        bench_endpoint(runs, flags.plan(), output_format)
        return
    if not runs:
        raise UserInputError("give RUN folders to benchmark, or --endpoint URL", "e.g. quantkit bench runs/*")
    _bench_runs(runs, price_per_hour, repeats, device, output_format, verbose)


def _bench_runs(
    runs: list[Path],
    price_per_hour: float | None,
    repeats: int | None,
    device: DeviceChoice | None,
    output_format: OutputFormat,
    verbose: bool,
) -> None:
    from rich.table import Table

    from quantkit.inputs.recipe import validate_section
    from quantkit.inputs.specs import BenchSpec
    from quantkit.metrics import format_metric
    from quantkit.results.store import load_run
    from quantkit.run.pipeline import bench_run

    records = [load_run(path) for path in runs]
    updates = {k: v for k, v in (("price_per_hour", price_per_hour), ("repeats", repeats)) if v is not None}
    flags = {"price_per_hour": "--price-per-hour", "repeats": "--repeats"}
    specs = [
        validate_section(
            BenchSpec, record.manifest.recipe.bench.model_dump(mode="json") | updates, "bench", flags
        )
        for record in records
    ]  # every flag is checked before anything is measured
    done = []
    for record, spec in zip(records, specs, strict=True):
        if output_format == OutputFormat.human:
            stderr.print(f"benchmarking {record.name} and its baseline")
        reporter = RichReporter() if output_format == OutputFormat.human else None
        done.append(bench_run(record, spec, device_value(device), reporter, verbose).record)
    if output_format == OutputFormat.json:
        emit_json(
            [
                {
                    "run": str(run.path),
                    "baseline": run.manifest.metrics.values("baseline"),
                    "quantized": run.manifest.metrics.values("quantized"),
                    "bench": None
                    if run.manifest.bench is None
                    else run.manifest.bench.model_dump(mode="json"),
                }
                for run in done
            ]
        )
        return
    names = (
        "prefill_tok_s",
        "decode_tok_s",
        "ttft_s",
        "peak_memory_bytes",
        "weights_memory_bytes",
        "cost_per_mtok_usd",
    )
    table = Table(title="speed and memory (medians; ratios vs baseline measured in the same run)")
    for column in (
        "run",
        "model",
        "prefill tok/s",
        "decode tok/s",
        "TTFT",
        "peak mem",
        "weights mem",
        "$/1M tok",
    ):
        table.add_column(column, justify="left" if column in ("run", "model") else "right")
    for run in done:
        for label in ("baseline", "quantized"):
            values = run.manifest.metrics.values(label)
            table.add_row(run.path.name, label, *(format_metric(name, values.get(name)) for name in names))
    stdout.print(table)
    for run in done:
        for note in getattr(run.manifest.bench, "notes", []):
            stderr.print(f"[yellow]note:[/yellow] {escape(run.path.name)}: {escape(note)}")
