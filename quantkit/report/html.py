"""A single self-contained HTML report: comparison table, warnings and two inline SVG plots."""

from __future__ import annotations

import datetime as dt
from html import escape

from quantkit import __version__
from quantkit.report import plots
from quantkit.report.table import NOTE, TEXT_KEYS, Comparison, Group, format_cell

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px;
       color: #212529; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 32px 0 8px; }
h3 { font-size: 16px; margin: 24px 0 8px; }
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
.table-scroll { overflow-x: auto; max-width: 100%; }
.warnings p, .meta, .note { overflow-wrap: anywhere; }
"""


def _table(comparison: Comparison, group: Group, index: int) -> str:
    columns = comparison.columns()
    head = "".join(
        f'<th class="text" scope="col">{escape(title)}</th>'
        if key in TEXT_KEYS
        else f'<th scope="col">{escape(title)}</th>'
        for key, title in columns
    )
    body = []
    for position, row in enumerate(group.rows):
        cells = []
        for key, _ in columns:
            text = escape(format_cell(key, row.get(key)))
            cells.append(f'<td class="text">{text}</td>' if key in TEXT_KEYS else f"<td>{text}</td>")
        tip = "" if position == 0 else f' title="{escape(str(row.get("path", "")))}"'
        body.append(f'<tr class="{"baseline" if position == 0 else "run"}"{tip}>{"".join(cells)}</tr>')
    table_id = "comparison" if index == 0 else f"comparison-{index}"
    return (  # a table wider than the window scrolls in its own box, not the page
        f'<div class="table-scroll"><table id="{table_id}">\n<thead><tr>{head}</tr></thead>\n<tbody>\n'
        + "\n".join(body)
        + "\n</tbody>\n</table></div>"
    )


def _plots(group: Group, index: int) -> str:
    speed = any(row.get("decode_tok_s") is not None for row in group.rows[1:])
    second_caption = (
        "Decode throughput against KLD mean: up and to the left is better."
        if speed
        else "No decode speed was measured for these runs, so this plot shows the ppl increase against "
        "bits per parameter of the file instead: down and to the left is better."
    )
    suffix = "" if index == 0 else f"-{index}"
    served = _served_plot(group, suffix)
    return f"""<div class="plots">
<figure id="plot-size{suffix}">
{plots.quality_vs_size(group.rows)}
<figcaption>KLD mean against size: down and to the left is better. Orange points joined by the dashed
line form the Pareto front: no other point is both smaller and lower in KLD. On a log axis the baseline's
KLD of 0 sits on its own slot below the axis break.</figcaption>
</figure>
<figure id="plot-speed{suffix}">
{plots.speed_vs_quality(group.rows)}
<figcaption>{escape(second_caption)} Orange points joined by the dashed line form the Pareto front
(not dominated on both axes).</figcaption>
</figure>{served}
</div>"""


def _served_plot(group: Group, suffix: str) -> str:
    """Latency against throughput across the load levels of every served model in the group."""
    series = []
    for position, row in enumerate(group.rows):
        levels = row.get("serve_levels")
        if not isinstance(levels, list) or not levels:
            continue
        points = [
            (str(level[0]), float(level[1]), float(level[2]))
            for level in levels
            if isinstance(level, list)
            and isinstance(level[1], (int, float))
            and isinstance(level[2], (int, float))
        ]
        name = "baseline" if position == 0 else str(row.get("name"))
        series.append(plots.Series(name, points, baseline=position == 0))
    if not series:
        return ""
    return f"""
<figure id="plot-served{suffix}">
{plots.latency_vs_throughput(series)}
<figcaption>Through the server (quantkit bench --endpoint): p95 end-to-end latency against output
tokens/s at each load level (c = concurrent requests): down and to the right is better. The dashed grey
line is the baseline served the same way, where it was measured.</figcaption>
</figure>"""


def _section(comparison: Comparison, group: Group, index: int) -> str:
    heading = ""
    if len(comparison.groups) > 1:
        heading = f"<h2>{escape(group.title())}</h2>\n"
    return f"""{heading}<h3>Quantized runs against the unquantized baseline</h3>
{_table(comparison, group, index)}
<h3>Trade-offs</h3>
{_plots(group, index)}"""


def to_html(comparison: Comparison) -> str:
    """The report as one HTML page with inline CSS and SVG: nothing is fetched when it is opened."""
    models = sorted({group.model for group in comparison.groups})
    model = ", ".join(models)
    created = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    runs = sum(len(group.rows) - 1 for group in comparison.groups)
    groups = len(comparison.groups)
    meta = (
        f"model: {model or '—'} · {runs} run(s) · {groups} baseline(s) · generated {created} "
        f"by quantkit {__version__}"
    )
    warnings = ""
    if comparison.warnings:
        items = "".join(f"<p>⚠ warning: {escape(text)}</p>" for text in comparison.warnings)
        warnings = f'<div class="warnings" role="alert">{items}</div>'
    sections = "\n".join(_section(comparison, group, index) for index, group in enumerate(comparison.groups))
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
{sections}
<p class="note">{escape(NOTE)} “—” means the value was not measured.</p>
</body>
</html>
"""
