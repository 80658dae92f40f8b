"""`quantkit eval RUN --endpoint URL`: the run's eval windows scored through a server serving
its artifact, against the run's cached reference; stored in the run beside the in-process
figures."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape

from quantkit.cli.output import OutputFormat, RichReporter, emit_json, stderr, stdout
from quantkit.errors import UserInputError

SHOWN = ("ppl", "ppl_increase_pct", "kld_mean", "kld_p99", "top1_agreement_pct")


def eval_endpoint(
    runs: list[Path],
    url: str,
    served_model: str | None,
    api_key: str | None,
    top_logprobs: int | None,
    output_format: OutputFormat,
) -> None:
    from rich.table import Table

    from quantkit.metrics import format_metric
    from quantkit.results.store import load_run
    from quantkit.run.pipeline import serve_eval_run
    from quantkit.serving.endpoint import Endpoint, check_url

    if top_logprobs is not None and not 1 <= top_logprobs <= 1024:
        raise UserInputError("--top-logprobs must be between 1 and 1024", "e.g. --top-logprobs 20")
    target = Endpoint(url=check_url(url), model=served_model, api_key=api_key or "EMPTY")
    records = [load_run(path) for path in runs]
    done = []
    for record in records:
        if output_format == OutputFormat.human:
            stderr.print(f"scoring {escape(record.name)}'s eval windows through {escape(target.url)}")
        reporter = RichReporter() if output_format == OutputFormat.human else None
        done.append(serve_eval_run(record, target, top_logprobs, reporter).record)
    if output_format == OutputFormat.json:
        emit_json(
            [
                {
                    "run": str(run.path),
                    "in_process": {name: run.manifest.metric(name) for name in SHOWN},
                    "served": None
                    if run.manifest.served_quality is None
                    else run.manifest.served_quality.model_dump(mode="json"),
                }
                for run in done
            ]
        )
        return
    table = Table(title="quality in process vs through the endpoint (same windows, same reference)")
    for column in ("run", "where", "ppl", "Δppl", "KLD", "KLD p99", "top-1 %"):
        table.add_column(column, justify="left" if column in ("run", "where") else "right")
    for run in done:
        served = run.manifest.served_quality
        estimator = run.manifest.eval.kld_estimator or ""
        table.add_row(
            run.path.name,
            f"in process ({estimator})" if estimator else "in process",
            *(format_metric(name, run.manifest.metric(name)) for name in SHOWN),
        )
        if served is not None:
            table.add_row(
                run.path.name,
                f"served ({served.protocol}, top-{served.top_k}+rest)",
                *(format_metric(name, served.metrics.get(f"served_{name}")) for name in SHOWN),
            )
    stdout.print(table)
