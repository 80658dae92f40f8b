"""The sensitivity profile as a table (terminal) and as bar charts (HTML, inline SVG), and a
search's candidates as a table."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.table import Table

    from quantkit.search.profile import Profile, UnitScore
    from quantkit.search.record import SearchRecord

BAR_W, BAR_GAP, CHART_H, LEFT, TOP, BOTTOM = 14, 4, 180, 70, 36, 110


def profile_table(profile: Profile) -> Table:
    from rich.table import Table

    table = Table(
        title=f"{profile.format} sensitivity of {profile.model}: one part at {profile.low}, "
        f"the rest at {profile.base}"
        + (f" (all-{profile.base} KLD {profile.base_kld:.5f})" if profile.base_kld is not None else "")
    )
    for column in ("part", "kind", "tensors", "params (M)", "KLD increase", "proxy (rank)"):
        table.add_column(column, justify="left" if column in ("part", "kind") else "right")
    ranks = {u.unit: rank for rank, u in enumerate(sorted(profile.units, key=lambda u: -u.proxy), 1)}
    for unit in profile.units:
        measured = "—" if unit.kld_increase is None else f"{unit.kld_increase:+.5f}"
        table.add_row(
            unit.unit,
            unit.kind,
            str(unit.tensors),
            f"{unit.params / 1e6:.2f}",
            measured,
            f"{unit.proxy:.4g} ({ranks[unit.unit]})",
        )
    return table


def _bars(title: str, units: list[UnitScore], measured: bool) -> str:
    """One SVG bar chart: measured KLD increase (or the proxy), one bar per unit."""
    values = [(u.kld_increase if measured else u.proxy) or 0.0 for u in units]
    top = max(max(values, default=0.0), 1e-12)
    width = LEFT + len(units) * (BAR_W + BAR_GAP) + 20
    height = TOP + CHART_H + BOTTOM
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" width="{width}" height="{height}" '
        f'role="img" aria-label="{escape(title)}" font-family="system-ui, sans-serif" font-size="11">',
        f"<title>{escape(title)}</title>",
        f'<text x="{LEFT}" y="20" font-size="14" font-weight="600">{escape(title)}</text>',
        f'<line x1="{LEFT}" y1="{TOP + CHART_H}" x2="{width - 10}" y2="{TOP + CHART_H}" stroke="#495057"/>',
        f'<text x="{LEFT - 6}" y="{TOP + 4}" text-anchor="end">{top:.3g}</text>',
        f'<text x="{LEFT - 6}" y="{TOP + CHART_H}" text-anchor="end">0</text>',
    ]
    for index, (unit, value) in enumerate(zip(units, values, strict=True)):
        x = LEFT + index * (BAR_W + BAR_GAP)
        bar = max(value, 0.0) / top * CHART_H
        colour = "#d9480f" if measured else "#1c7ed6"
        label = unit.unit.removeprefix("layer ").removesuffix(".weight")
        parts.append(
            f'<rect x="{x}" y="{TOP + CHART_H - bar:.1f}" width="{BAR_W}" height="{bar:.1f}" fill="{colour}">'
            f"<title>{escape(unit.unit)}: {value:.5g}</title></rect>"
        )
        y = TOP + CHART_H + 10
        parts.append(
            f'<text x="{x + BAR_W / 2}" y="{y}" text-anchor="end" '
            f'transform="rotate(-60 {x + BAR_W / 2} {y})">{escape(label)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def profile_section(profile: Profile) -> str:
    """The profile's charts as an HTML section (per layer and per tensor class; measured and proxy)."""
    measured = profile.base_kld is not None
    what = f"{profile.low} on one part, {profile.base} elsewhere"
    if profile.format != "gguf":
        what += f", group size {profile.group_size or 'per channel'}"
    charts = []
    for label, units in (
        ("per decoder layer", profile.layer_units()),
        ("per tensor class", profile.class_units()),
    ):
        if measured:
            charts.append(_bars(f"measured KLD increase {label} ({what})", units, True))
        charts.append(_bars(f"proxy E||dW x||^2 {label} ({what})", units, False))
    spearman = ", ".join(f"{key} {value}" for key, value in profile.spearman.items()) or "not measured"
    return (
        f"<section><h2>sensitivity profile ({escape(profile.format)})</h2>"
        f"<p>{escape(profile.model)}; Spearman (proxy vs measured): {escape(spearman)}; "
        f"cost: {escape(str(profile.cost))}</p>" + "\n".join(charts) + "</section>"
    )


def profile_html(profiles: list[Profile]) -> str:
    """A page with every format's profile."""
    sections = "\n".join(map(profile_section, profiles))
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>quantkit sensitivity — {escape(profiles[0].model)}</title></head><body>"
        f"<h1>quantkit sensitivity</h1>{sections}</body></html>"
    )


def candidates_table(record: SearchRecord) -> Table:
    from rich.table import Table

    table = Table(title=f"search on {record.model}: {record.budget.describe()}, objective {record.objective}")
    columns = ["candidate", "format", "path step", "predicted bpw", "bpw", "KLD", "budget value"]
    measured = record.objective != "size"  # the sweep benched the candidates
    columns += ["decode tok/s", "peak MB"] if measured else []
    for column in [*columns, "met"]:
        table.add_column(column, justify="left" if column == "candidate" else "right")
    for c in record.candidates:
        met = "—" if c.passed is None else ("yes" if c.passed else "no")
        row = [
            c.name + (" ★" if c.name == record.chosen else ""),
            c.format,
            str(c.index),
            f"{c.predicted_bpw:.3f}",
            "—" if c.bpw is None else f"{c.bpw:.3f}",
            "—" if c.kld is None else f"{c.kld:.5f}",
            "—" if c.value is None else f"{c.value:.5g}",
        ]
        if measured:
            row += [
                "—" if c.decode_tok_s is None else f"{c.decode_tok_s:.1f}",
                "—" if c.peak_memory_bytes is None else f"{c.peak_memory_bytes / 1e6:.1f}",
            ]
        table.add_row(*row, met if c.error is None else f"failed: {c.error}")
    return table
