"""A single self-contained HTML report: comparison table, warnings and two inline SVG plots."""

from __future__ import annotations

import datetime as dt
from html import escape

from quantkit import __version__
from quantkit.report import plots
from quantkit.report.table import TEXT_KEYS, Comparison, format_cell

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px;
       color: #212529; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
.meta, .note, figcaption { color: #495057; font-size: 13px; }
table { border-collapse: collapse; font-size: 13px; margin-top: 8px; }
th, td { padding: 5px 10px; border-bottom: 1px solid #dee2e6; white-space: nowrap; }
th { background: #e9ecef; text-align: right; } th.text, td.text { text-align: left; }
td { text-align: right; font-variant-numeric: tabular-nums; }
tr.baseline td { font-weight: 600; background: #f1f3f5; }
tr.run:hover td { background: #fff9db; }
.warnings { border-left: 4px solid #f59f00; background: #fff9db; padding: 8px 12px; margin: 12px 0; }
.warnings p { margin: 2px 0; }
.plots { display: flex; flex-wrap: wrap; gap: 24px; }
figure { margin: 0; max-width: 640px; } figure svg { max-width: 100%; height: auto; }
"""


def _table(comparison: Comparison) -> str:
    columns = comparison.columns()
    head = "".join(
        f'<th class="text" scope="col">{escape(title)}</th>'
        if key in TEXT_KEYS
        else f'<th scope="col">{escape(title)}</th>'
        for key, title in columns
    )
    body = []
    for index, row in enumerate(comparison.rows):
        cells = []
        for key, _ in columns:
            text = escape(format_cell(key, row.get(key)))
            cells.append(f'<td class="text">{text}</td>' if key in TEXT_KEYS else f"<td>{text}</td>")
        tip = "" if index == 0 else f' title="{escape(str(row.get("run_id", "")))}"'
        body.append(f'<tr class="{"baseline" if index == 0 else "run"}"{tip}>{"".join(cells)}</tr>')
    return (
        f'<table id="comparison">\n<thead><tr>{head}</tr></thead>\n<tbody>\n'
        + "\n".join(body)
        + "\n</tbody>\n</table>"
    )


def to_html(comparison: Comparison) -> str:
    """The report as one HTML page with inline CSS and SVG: nothing is fetched when it is opened."""
    model = comparison.rows[0].get("model") if comparison.rows else None
    created = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    runs = len(comparison.rows) - 1
    meta = f"model: {model or '—'} · {runs} run(s) · generated {created} by quantkit {__version__}"
    warnings = ""
    if comparison.warnings:
        items = "".join(f"<p>⚠ warning: {escape(text)}</p>" for text in comparison.warnings)
        warnings = f'<div class="warnings" role="alert">{items}</div>'
    speed = any(row.get("decode_tok_s") is not None for row in comparison.rows[1:])
    second_caption = (
        "Decode throughput against KLD mean: up and to the left is better."
        if speed
        else "No decode speed was measured for these runs, so this plot shows the ppl increase against "
        "bits per weight instead: down and to the left is better."
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>quantkit comparison{escape(f" — {model}" if model else "")}</title>
<style>{_CSS}</style>
</head>
<body>
<h1>quantkit comparison</h1>
<p class="meta">{escape(meta)}</p>
{warnings}
<h2>Quantized runs against the unquantized baseline</h2>
{_table(comparison)}
<p class="note">Δppl and KLD are against the unquantized baseline on identical token windows; KLD is
KL(baseline ‖ quantized) in nats per token. “—” means the value was not measured.</p>
<h2>Trade-offs</h2>
<div class="plots">
<figure id="plot-size">
{plots.quality_vs_size(comparison.rows)}
<figcaption>KLD mean against size: down and to the left is better. Orange points joined by the dashed
line form the Pareto front: no other point is both smaller and lower in KLD. On a log axis the baseline's
KLD of 0 sits on its own slot below the axis break.</figcaption>
</figure>
<figure id="plot-speed">
{plots.speed_vs_quality(comparison.rows)}
<figcaption>{escape(second_caption)} Orange points joined by the dashed line form the Pareto front
(not dominated on both axes).</figcaption>
</figure>
</div>
</body>
</html>
"""
