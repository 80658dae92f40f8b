"""The metric table of docs/metrics.md, made from the registry:
``python -m quantkit.metrics.table > docs/metrics.md`` (a test checks the file is current)."""

from __future__ import annotations

from quantkit.metrics.registry import METRICS

HEADER = """# Metrics

Every metric quantkit reports, as registered in `quantkit.metrics` (made by
`python -m quantkit.metrics.table`; do not edit by hand). *Better*: the direction a gate bounds
(`max_` fields for lower-is-better metrics, `min_` for the others). *Relative*: measured against
the unquantized baseline. A plug-in adds a metric through the `quantkit.metrics` entry-point group.
"""


def markdown() -> str:
    """The whole of docs/metrics.md."""
    lines = [
        HEADER,
        "| metric | unit | better | relative | stage | gate field | `quantkit gate` flag | report column "
        "| meaning |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for info in METRICS.all():
        gate = info.gate
        cells = [
            f"`{info.name}`",
            info.unit or "–",
            "higher" if info.higher_is_better else "lower",
            "yes" if info.relative else "no",
            info.stage,
            f"`{info.gate_field}`" if gate else "–",
            f"`{gate.flag}`" if gate else "–",
            info.column or "–",
            info.description.replace("|", "\\|"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
