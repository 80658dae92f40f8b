"""Small pure-Python SVG scatter plots for the HTML report (no plotting library)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from html import escape

from pydantic import JsonValue

WIDTH, HEIGHT = 640, 430
LEFT, RIGHT, TOP, BOTTOM = 78, 24, 44, 92
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
FRONT_COLOUR, RUN_COLOUR, BASE_COLOUR = "#d9480f", "#1c7ed6", "#495057"


@dataclass(frozen=True)
class Point:
    """One labelled marker; ``baseline`` draws it as a grey square."""

    label: str
    x: float
    y: float
    baseline: bool = False
    tooltip: str = ""


def pareto_front(points: Sequence[tuple[float, float]], maximize_y: bool = False) -> list[int]:
    """Indices of the points no other point dominates, sorted by x.

    Smaller x is better; smaller y is better (larger with ``maximize_y``). A point is dominated
    when another is at least as good on both axes and strictly better on one.
    """
    sign = -1.0 if maximize_y else 1.0
    keyed = [(x, sign * y) for x, y in points]
    front = [
        i
        for i, (x, y) in enumerate(keyed)
        if not any(ox <= x and oy <= y and (ox < x or oy < y) for ox, oy in keyed)
    ]
    return sorted(front, key=lambda i: (keyed[i][0], keyed[i][1]))


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (the first and last may lie just outside)."""
    if not hi > lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    start = math.floor(lo / step + 1e-9) * step
    ticks = []
    value = start
    while value < hi + step * 0.999:
        ticks.append(round(value, 12))
        value += step
    return ticks


def _label(value: float) -> str:
    return "0" if value == 0 else f"{value:g}"


class Axis:
    """Maps data values to [0, 1]; log scale puts zeros on their own slot below the first decade."""

    def __init__(self, values: Sequence[float], log: bool | None = None) -> None:
        positive = [v for v in values if v > 0]
        if log is None:
            log = bool(positive) and max(positive) / min(positive) >= 100
        self.log = log
        self.has_zero = log and any(v <= 0 for v in values)
        if log:
            low = math.floor(math.log10(min(positive)))
            high = max(math.ceil(math.log10(max(positive))), low + 1)
            self.decades = list(range(low, high + 1))
            self.lo = low - (0.9 if self.has_zero else 0.1)
            self.hi = high + 0.05
        else:
            self.ticks = nice_ticks(min(values), max(values)) if values else [0.0, 1.0]
            pad = 0.03 * (self.ticks[-1] - self.ticks[0])  # keeps markers off the frame
            self.lo, self.hi = self.ticks[0] - pad, self.ticks[-1] + pad

    def frac(self, value: float) -> float:
        if self.log:
            pos = self.decades[0] - 0.7 if value <= 0 else math.log10(value)
            return (pos - self.lo) / (self.hi - self.lo)
        return (value - self.lo) / (self.hi - self.lo)

    def tick_marks(self) -> list[tuple[float, str]]:
        if self.log:
            marks = [(10.0**d, _label(10.0**d)) for d in self.decades]
            return ([(0.0, "0")] if self.has_zero else []) + marks
        return [(t, _label(t)) for t in self.ticks]


def _text(x: float, y: float, text: str, **attrs: object) -> str:
    extra = "".join(f' {k.rstrip("_").replace("_", "-")}="{escape(str(v))}"' for k, v in attrs.items())
    return f'<text x="{x:.1f}" y="{y:.1f}"{extra}>{escape(text)}</text>'


def _place_labels(spots: list[tuple[float, float, str]]) -> list[tuple[float, float, str, str]]:
    """Greedy de-overlap: nudge a label down until its box clears the ones already placed."""
    placed: list[tuple[float, float, float, float]] = []
    out = []
    for px, py, text in spots:
        width = 6.6 * len(text) + 4
        right_side = px + 8 + width < LEFT + PLOT_W
        x0 = px + 8 if right_side else px - 8 - width
        y = py - 6
        for _ in range(12):
            box = (x0, y - 11, x0 + width, y + 2)
            if not any(b[0] < box[2] and box[0] < b[2] and b[1] < box[3] and box[1] < b[3] for b in placed):
                break
            y += 13
        placed.append((x0, y - 11, x0 + width, y + 2))
        out.append((px + 8, y, text, "start") if right_side else (px - 8, y, text, "end"))
    return out


@dataclass(frozen=True)
class PlotSpec:
    """What a scatter plot shows: its title, axis titles, which way is better, axis scales
    (``None``: logarithmic when the values span more than a decade)."""

    title: str
    x_label: str
    y_label: str
    maximize_y: bool = False
    x_log: bool | None = None
    y_log: bool | None = None


def _frame(
    title: str, x_axis: Axis, y_axis: Axis, x_label: str, y_label: str
) -> tuple[list[str], Callable[[float], float], Callable[[float], float]]:
    """An open SVG with its title, plot area, ticks, axis breaks and axis titles, and the
    functions mapping data values to x and y."""

    def sx(v: float) -> float:
        return LEFT + x_axis.frac(v) * PLOT_W

    def sy(v: float) -> float:
        return TOP + (1 - y_axis.frac(v)) * PLOT_H

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}" '
        'font-family="system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif" font-size="12">',
        f"<title>{escape(title)}</title>",
        f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
        _text(WIDTH / 2, 24, title, text_anchor="middle", font_size="15", font_weight="600"),
        f'<rect x="{LEFT}" y="{TOP}" width="{PLOT_W}" height="{PLOT_H}" fill="#f8f9fa" stroke="#adb5bd"/>',
    ]
    for value, text in x_axis.tick_marks():
        x = sx(value)
        parts.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + PLOT_H}" stroke="#e9ecef"/>')
        parts.append(_text(x, TOP + PLOT_H + 17, text, text_anchor="middle", fill="#343a40"))
    for value, text in y_axis.tick_marks():
        y = sy(value)
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + PLOT_W}" y2="{y:.1f}" stroke="#e9ecef"/>')
        parts.append(_text(LEFT - 7, y + 4, text, text_anchor="end", fill="#343a40"))
    if y_axis.has_zero:  # axis break between the zero slot and the first decade
        y = sy(10.0 ** (y_axis.decades[0] - 0.35))
        parts.append(
            f'<path d="M{LEFT - 5},{y + 4:.1f} l10,-5 M{LEFT - 5},{y + 8:.1f} l10,-5" stroke="#495057"/>'
        )
    if x_axis.has_zero:
        x = sx(10.0 ** (x_axis.decades[0] - 0.35))
        y0 = TOP + PLOT_H
        parts.append(f'<path d="M{x - 4:.1f},{y0 + 5} l5,-10 M{x:.1f},{y0 + 5} l5,-10" stroke="#495057"/>')
    parts.append(
        _text(LEFT + PLOT_W / 2, TOP + PLOT_H + 38, x_label, text_anchor="middle", font_weight="600")
    )
    y_mid = TOP + PLOT_H / 2
    parts.append(
        _text(
            18, y_mid, y_label, text_anchor="middle", font_weight="600", transform=f"rotate(-90 18 {y_mid})"
        )
    )
    return parts, sx, sy


def scatter_svg(points: Sequence[Point], spec: PlotSpec) -> str:
    """An SVG scatter plot with tick labels, axis titles, labelled points and the Pareto front."""
    xs, ys = [p.x for p in points], [p.y for p in points]
    x_axis, y_axis = Axis(xs, spec.x_log), Axis(ys, spec.y_log)
    parts, sx, sy = _frame(spec.title, x_axis, y_axis, spec.x_label, spec.y_label)

    front = pareto_front([(p.x, p.y) for p in points], maximize_y=spec.maximize_y)
    if len(front) > 1:
        path = " ".join(f"{sx(points[i].x):.1f},{sy(points[i].y):.1f}" for i in front)
        parts.append(
            f'<polyline class="front" points="{path}" fill="none" stroke="{FRONT_COLOUR}" '
            'stroke-width="2" stroke-dasharray="6 4"/>'
        )
    on_front = set(front)
    spots = []
    for index, point in enumerate(points):
        x, y = sx(point.x), sy(point.y)
        tip = f"<title>{escape(point.tooltip or point.label)}</title>"
        colour = FRONT_COLOUR if index in on_front else (BASE_COLOUR if point.baseline else RUN_COLOUR)
        kind = "point baseline" if point.baseline else "point"
        kind += " pareto" if index in on_front else ""
        if point.baseline:
            parts.append(
                f'<rect class="{kind}" x="{x - 6:.1f}" y="{y - 6:.1f}" width="12" height="12" '
                f'fill="{colour}" stroke="#212529">{tip}</rect>'
            )
        else:
            parts.append(
                f'<circle class="{kind}" cx="{x:.1f}" cy="{y:.1f}" r="6" fill="{colour}" '
                f'stroke="#212529" fill-opacity="0.9">{tip}</circle>'
            )
        spots.append((x, y, point.label))
    for x, y, text, anchor in _place_labels(spots):
        parts.append(_text(x, y, text, fill="#212529", class_="label", text_anchor=anchor))
    if not points:
        parts.append(
            _text(LEFT + PLOT_W / 2, TOP + PLOT_H / 2, "no data", text_anchor="middle", fill="#868e96")
        )

    legend_y = HEIGHT - 22
    parts += [
        f'<rect x="{LEFT}" y="{legend_y - 9}" width="10" height="10" fill="{BASE_COLOUR}" stroke="#212529"/>',
        _text(LEFT + 15, legend_y, "baseline"),
        f'<circle cx="{LEFT + 90}" cy="{legend_y - 4}" r="5" fill="{RUN_COLOUR}" stroke="#212529"/>',
        _text(LEFT + 100, legend_y, "quantized run"),
        f'<line x1="{LEFT + 200}" y1="{legend_y - 4}" x2="{LEFT + 226}" y2="{legend_y - 4}" '
        f'stroke="{FRONT_COLOUR}" stroke-width="2" stroke-dasharray="6 4"/>',
        f'<circle cx="{LEFT + 213}" cy="{legend_y - 4}" r="5" fill="{FRONT_COLOUR}" stroke="#212529"/>',
        _text(LEFT + 232, legend_y, "Pareto front (no other point is better on both axes)"),
        "</svg>",
    ]
    return "\n".join(parts)


def _labels(rows: Sequence[Mapping[str, JsonValue]]) -> list[str]:
    """Row names, made unique with the scheme (then a number) when runs share a name."""
    names = [str(row.get("name")) for row in rows]
    labels = [
        f"{name} [{row.get('scheme')}]" if names.count(name) > 1 else name
        for name, row in zip(names, rows, strict=True)
    ]
    return [f"{label} #{i}" if labels.count(label) > 1 else label for i, label in enumerate(labels)]


def _points(
    rows: Sequence[Mapping[str, JsonValue]], x_key: str, y_key: str, x_scale: float = 1.0
) -> list[Point]:
    out = []
    for index, (row, label) in enumerate(zip(rows, _labels(rows), strict=True)):
        x, y = row.get(x_key), row.get(y_key)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)):
            tip = f"{label}: {x_key}={x:g}, {y_key}={y:g}"
            out.append(Point(label, x / x_scale, float(y), baseline=index == 0, tooltip=tip))
    return out


def _bits_key(rows: Sequence[Mapping[str, JsonValue]]) -> tuple[str, str]:
    """The table's "bpw (file)" (bits per parameter of the whole file: the baseline's fp16/fp32
    file too) when every row has it, else the nominal bits per quantized weight."""
    if all(row.get("file_bpw") is not None for row in rows):
        return "file_bpw", "bits per parameter (file)"
    return "weight_bits", "bits / weight (nominal)"


def quality_vs_size(rows: Sequence[Mapping[str, JsonValue]]) -> str:
    """KLD mean against disk size (MB), or against bits per parameter where sizes are missing."""
    if all(row.get("disk_bytes") is not None for row in rows):
        points, x_label = _points(rows, "disk_bytes", "kld_mean", 1e6), "disk size (MB)"
    else:
        key, x_label = _bits_key(rows)
        points = _points(rows, key, "kld_mean")
    spec = PlotSpec("Quality vs size", x_label, "KLD mean (nats/token, lower is better)")
    return scatter_svg(points, spec)


def speed_vs_quality(rows: Sequence[Mapping[str, JsonValue]]) -> str:
    """Decode tok/s against KLD mean; without speed numbers, Δppl % against bits per parameter."""
    if any(row.get("decode_tok_s") is not None for row in rows[1:]):
        speed = PlotSpec(
            "Decode speed vs quality",
            x_label="KLD mean (nats/token, lower is better)",
            y_label="decode tok/s (higher is better)",
            maximize_y=True,
        )
        return scatter_svg(_points(rows, "kld_mean", "decode_tok_s"), speed)
    key, x_label = _bits_key(rows)
    size = PlotSpec(
        "Size vs quality (no decode speed measured)",
        x_label=x_label,
        y_label="Δppl % (lower is better)",
        x_log=False,
        y_log=False,
    )
    return scatter_svg(_points(rows, key, "ppl_increase_pct"), size)


@dataclass(frozen=True)
class Series:
    """One model served at several load levels: (label, output tok/s, p95 E2E s) per level."""

    name: str
    levels: list[tuple[str, float, float]]
    baseline: bool = False


SERIES_COLOURS = ("#1c7ed6", "#d9480f", "#2f9e44", "#9c36b5", "#e67700", "#0c8599")


def latency_vs_throughput(series: Sequence[Series]) -> str:
    """p95 end-to-end latency against output throughput, one line per served model through
    its load levels (each point labelled with its level): down and to the right is better."""
    xs = [x for s in series for _, x, _ in s.levels]
    ys = [y for s in series for _, _, y in s.levels]
    x_axis, y_axis = Axis(xs or [0.0, 1.0], False), Axis(ys or [0.0, 1.0], False)
    parts, sx, sy = _frame(
        "Latency vs throughput, served",
        x_axis,
        y_axis,
        "output tokens/s (higher is better)",
        "p95 end-to-end latency, s (lower is better)",
    )
    for index, item in enumerate(series):
        colour = BASE_COLOUR if item.baseline else SERIES_COLOURS[index % len(SERIES_COLOURS)]
        dash = ' stroke-dasharray="6 4"' if item.baseline else ""
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for _, x, y in item.levels)
        parts.append(
            f'<polyline class="series" points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>'
        )
        for label, x, y in item.levels:
            tip = f"<title>{escape(item.name)} at {escape(label)}: {x:.1f} tok/s, p95 {y:.3f} s</title>"
            parts.append(
                f'<circle class="point" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="5" fill="{colour}" '
                f'stroke="#212529">{tip}</circle>'
            )
            parts.append(_text(sx(x) + 7, sy(y) - 7, label, fill="#212529", class_="label"))
        legend_y = HEIGHT - 40 + 14 * (index // 3)
        legend_x = LEFT + 190 * (index % 3)
        parts.append(
            f'<line x1="{legend_x}" y1="{legend_y - 4}" x2="{legend_x + 22}" y2="{legend_y - 4}" '
            f'stroke="{colour}" stroke-width="2"{dash}/>'
        )
        parts.append(_text(legend_x + 28, legend_y, item.name[:28]))
    if not series:
        parts.append(
            _text(LEFT + PLOT_W / 2, TOP + PLOT_H / 2, "no data", text_anchor="middle", fill="#868e96")
        )
    parts.append("</svg>")
    return "\n".join(parts)
