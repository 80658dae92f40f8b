"""The HTML report: Pareto front, SVG plots, `quantkit report -o report.html`, and a real browser render."""

from __future__ import annotations

import json
import re
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import run_chromium, synthetic_record, write_tiny_recipe

from quantkit.cli import main
from quantkit.report import plots, render, table
from quantkit.results.store import RunRecord

SVG = "{http://www.w3.org/2000/svg}"
CHROMIUM = Path("/usr/bin/chromium")


def run_cli(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str, str]:
    code = main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _record(
    name: str, scheme: str, bits: float, disk: float, kld: float, ppl_pct: float, **extra: float
) -> RunRecord:
    quantized = {
        "ppl": 10 * (1 + ppl_pct / 100),
        "ppl_increase_pct": ppl_pct,
        "kld_mean": kld,
        "kld_p99": kld * 5,
        "top1_agreement_pct": 100 - kld * 40,
    } | extra
    baseline = {"ppl": 10.0} | ({"decode_tok_s": 20.0} if "decode_tok_s" in extra else {})
    return synthetic_record(name, scheme, quantized, baseline, bits=bits, disk=int(disk))


def _synthetic(speed: bool = True) -> table.Comparison:
    def perf(tok_s: float, mem: float) -> dict[str, float]:
        return (
            {"decode_tok_s": tok_s, "decode_speed_ratio": tok_s / 20, "peak_memory_bytes": mem}
            if speed
            else {}
        )

    records = [
        _record("fp8", "FP8_DYNAMIC", 8, 280e6, 0.002, 0.3, **perf(30, 3e8)),
        _record("gptq-w4", "W4A16", 4.25, 150e6, 0.04, 3.1, **perf(45, 2e8)),
        _record("rtn-w4", "W4A16", 4.25, 150e6, 0.09, 6.0, **perf(44, 2e8)),
        _record("q2 <b>&", "Q2_K", 2.6, 90e6, 0.6, 40.0, **perf(55, 1.5e8)),
    ]
    records[2].manifest.environment.libraries["torch"] = "2.99"  # a warning in the report
    return table.build(records)


# --- pareto_front and the SVG builders ---------------------------------------------------------


def test_pareto_front_minimizes_both_axes() -> None:
    points = [(4.0, 1.0), (1.0, 5.0), (3.0, 4.0), (2.0, 3.0), (2.0, 3.0), (5.0, 1.0)]
    # (3, 4) is beaten by (2, 3); (5, 1) by (4, 1); equal points do not dominate each other
    assert plots.pareto_front(points) == [1, 3, 4, 0]
    assert plots.pareto_front([]) == []
    assert plots.pareto_front([(1.0, 1.0)]) == [0]


def test_pareto_front_can_maximize_y() -> None:
    kld_vs_speed = [(0.0, 20.0), (0.002, 30.0), (0.04, 45.0), (0.09, 44.0), (0.6, 55.0), (0.7, 50.0)]
    assert plots.pareto_front(kld_vs_speed, maximize_y=True) == [0, 1, 2, 4]


def test_nice_ticks_cover_the_range() -> None:
    ticks = plots.nice_ticks(0.13, 9.7)
    assert ticks[0] <= 0.13 and ticks[-1] >= 9.7 and 3 <= len(ticks) <= 8
    assert plots.nice_ticks(5.0, 5.0)[0] < 5.0 < plots.nice_ticks(5.0, 5.0)[-1]


def _parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return root


def _points(root: ET.Element) -> list[ET.Element]:
    return [el for el in root.iter() if "point" in el.get("class", "").split()]


def test_scatter_svg_is_valid_xml_with_one_marker_per_point() -> None:
    pts = [
        plots.Point("baseline", 540, 0.0, baseline=True),
        plots.Point("a <&> 'b'", 280, 0.002),
        plots.Point("c", 150, 0.04),
        plots.Point("d", 150, 0.09),
        plots.Point("e", 90, 0.6),
    ]
    root = _parse(plots.scatter_svg(pts, plots.PlotSpec("T & <t>", x_label="size", y_label="KLD")))
    assert len(_points(root)) == 5
    pareto = [el for el in _points(root) if "pareto" in el.get("class", "")]
    assert len(pareto) == 4  # d is beaten by c
    assert len(root.findall(f"{SVG}polyline")) == 1
    texts = [el.text for el in root.iter(f"{SVG}text")]
    assert "a <&> 'b'" in texts and "T & <t>" in texts
    assert "0" in texts and "0.01" in texts  # KLD spans decades: log axis with a slot for the zero
    assert any("Pareto front" in (text or "") for text in texts)


def test_scatter_svg_handles_no_and_single_points() -> None:
    assert "no data" in plots.scatter_svg([], plots.PlotSpec("t", "x", "y"))
    root = _parse(plots.scatter_svg([plots.Point("only", 1.0, 1.0)], plots.PlotSpec("t", "x", "y")))
    assert len(_points(root)) == 1 and not root.findall(f"{SVG}polyline")


def test_plots_from_rows_use_speed_when_measured() -> None:
    rows = _synthetic().rows
    size = _parse(plots.quality_vs_size(rows))
    speed = _parse(plots.speed_vs_quality(rows))
    assert len(_points(size)) == len(_points(speed)) == 5
    assert speed.findtext(f"{SVG}title") == "Decode speed vs quality"
    fallback = _parse(plots.speed_vs_quality(_synthetic(speed=False).rows))
    assert "Size vs quality" in (fallback.findtext(f"{SVG}title") or "")
    assert len(_points(fallback)) == 5


# --- table columns -----------------------------------------------------------------------------


def test_optional_columns_only_when_measured() -> None:
    with_speed, without = _synthetic(), _synthetic(speed=False)
    for row in with_speed.rows + without.rows:
        assert {key for key, _ in table.optional_columns()} <= row.keys()
    keys = [key for key, _ in with_speed.columns()]
    assert "decode_tok_s" in keys and "peak_memory_bytes" in keys and "cost_per_mtok_usd" not in keys
    assert with_speed.rows[0]["decode_tok_s"] == 20.0 and with_speed.rows[0]["decode_speed_ratio"] == 1.0
    assert without.columns() == table.fixed_columns()
    assert "decode tok/s" in render.to_markdown(with_speed)
    assert "decode tok/s" not in render.to_markdown(without)
    assert json.loads(render.to_json(with_speed))["columns"] == keys


def test_html_is_self_contained_and_escaped() -> None:
    page = render.to_html(_synthetic())
    assert page.count("<svg") == 2 and page.count('<tr class="run"') == 4
    assert "q2 &lt;b&gt;&amp;" in page and "q2 <b>" not in page
    assert 'class="warnings"' in page and "different library versions" in page
    assert not re.search(r"<link|<script|<img|@import|url\(", page)
    assert re.findall(r"https?://[^\"' ]+", page) == ["http://www.w3.org/2000/svg"] * 2


# --- the CLI over two real runs of the tiny model ------------------------------------------------


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, session_cache: Path) -> list[Path]:
    """Two quantized runs of the tiny model (FP8 dynamic and FP8 block), made once for this module."""
    folder = tmp_path_factory.mktemp("html-runs")
    recipe = write_tiny_recipe(folder, tiny_model)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("QUANTKIT_CACHE", str(session_cache))
        patch.setenv("QUANTKIT_RUNS_DIR", str(folder / "runs"))
        assert main(["quantize", str(recipe), "--out", str(folder / "a")]) == 0
        args = ["quantize", str(recipe), "--out", str(folder / "b"), "--set", "options.scheme=FP8_BLOCK"]
        assert main(args) == 0
    return [folder / "a", folder / "b"]


def test_report_writes_html(two_runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "report.html"
    code, out, err = run_cli(capsys, "report", *two_runs, "-o", target, "-o", tmp_path / "r.htm")
    assert code == 0, err
    assert "wrote" in err and "baseline" in out and (tmp_path / "r.htm").is_file()
    page = target.read_text(encoding="utf-8")
    rows = re.findall(r"<tr class=\"(baseline|run)\"[^>]*>(.*?)</tr>", page)
    assert [kind for kind, _ in rows] == ["baseline", "run", "run"]
    assert '<td class="text">baseline</td>' in rows[0][1]
    assert "FP8_DYNAMIC" in rows[1][1] and "FP8_BLOCK" in rows[2][1]
    for title in ("bits (quantized)", "bpw (file)", "disk", "ppl", "Δppl %", "KLD mean", "top-1 %", "run id"):
        assert f">{title}</th>" in page
    svgs = re.findall(r"<svg.*?</svg>", page, flags=re.S)
    assert len(svgs) == 2
    for svg in svgs:
        assert len(_points(_parse(svg))) == 3  # baseline + two runs
    manifests = [json.loads((run / "manifest.json").read_text()) for run in two_runs]
    if any("decode_tok_s" in manifest["metrics"]["quantized"] for manifest in manifests):
        assert ">decode tok/s</th>" in page and "Decode speed vs quality" in svgs[1]
    else:  # no speed stage: no speed columns, and the second plot falls back to size vs quality
        assert ">decode tok/s</th>" not in page
        assert "Size vs quality (no decode speed measured)" in svgs[1]


# --- the page in a real browser ------------------------------------------------------------------


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_chromium(tmp_path, *args)


@pytest.fixture(params=["cli", "synthetic"])
def html_page(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """(page, number of runs): one from the CLI over real runs, one with speed columns and warnings."""
    target = tmp_path / "report.html"
    if request.param == "cli":
        runs = request.getfixturevalue("two_runs")
        assert main(["report", *map(str, runs), "-o", str(target)]) == 0
        yield target, 2
    else:
        target.write_text(render.to_html(_synthetic()), encoding="utf-8")
        yield target, 4


def test_chromium_renders_the_report(html_page: tuple[Path, int], tmp_path: Path) -> None:
    from PIL import Image

    page, runs = html_page
    dom = _chromium(tmp_path, "--dump-dom", page.resolve().as_uri()).stdout
    assert '<table id="comparison">' in dom
    assert len(re.findall(r"<tr class=\"run\"", dom)) == runs
    assert len(re.findall(r"<svg\b", dom)) == 2
    assert len(re.findall(r"class=\"point\b", dom)) == 2 * (runs + 1)

    png = tmp_path / "shot.png"
    _chromium(tmp_path, f"--screenshot={png}", page.resolve().as_uri())
    with Image.open(png) as image:
        rgb = image.convert("RGB")
    assert rgb.size == (1400, 1000)
    colours = rgb.getcolors(maxcolors=1 << 22)
    assert colours is not None and len(colours) > 50, "the screenshot is (nearly) blank"
    assert max(count for count, _ in colours) < 0.97 * 1400 * 1000
    orange = sum(count for count, (r, g, b) in colours if abs(r - 217) + abs(g - 72) + abs(b - 15) < 40)
    assert orange > 100, "the SVG plots (orange Pareto markers) did not render"


def test_runs_against_different_baselines_get_one_baseline_row_each() -> None:
    """Two models: each group has its own baseline row, and the rows' deltas are against it."""
    a = _record("a-w4", "W4A16", 4.25, 150e6, 0.04, 3.1)
    b = synthetic_record(
        "b-w4", "W4A16", {"ppl": 22.0, "ppl_increase_pct": 10.0, "kld_mean": 0.1}, {"ppl": 20.0},
        model="other/model", fingerprint="e" * 64,
    )  # fmt: skip
    comparison = table.build([a, b, _record("a-fp8", "FP8_DYNAMIC", 8, 280e6, 0.002, 0.3)])
    assert [group.model for group in comparison.groups] == ["tiny/model", "other/model"]
    names = [(row["name"], row["group"], row["ppl"]) for row in comparison.rows]
    assert names == [
        ("baseline", 0, 10.0),
        ("a-w4", 0, pytest.approx(10.31)),
        ("a-fp8", 0, pytest.approx(10.03)),
        ("baseline", 1, 20.0),
        ("b-w4", 1, 22.0),
    ]
    assert "2 different baselines" in comparison.warnings[0]
    markdown = render.to_markdown(comparison)
    assert markdown.count("## tiny/model on cpu") == 1 and markdown.count("## other/model on cpu") == 1
    assert markdown.count("| baseline |") == 2
    page = render.to_html(comparison)
    assert page.count("<svg") == 4 and '<table id="comparison-1">' in page
    assert json.loads(render.to_json(comparison))["groups"][1]["runs"] == 1


def test_a_schema_1_run_still_loads_reports_and_gates(tmp_path: Path, capsys) -> None:
    """A run written by quantkit 0.1 (tests/data/run-v1): report and gate read it unchanged."""
    import shutil

    from conftest import V1_RUN

    run = tmp_path / "run-v1"
    shutil.copytree(V1_RUN, run)
    code, out, err = run_cli(capsys, "report", run, "-o", tmp_path / "r.json")
    assert code == 0, err
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert [row["name"] for row in rows] == ["baseline", "tiny-fp8"]
    assert rows[1]["kld_mean"] == pytest.approx(4.0707636e-06) and rows[1]["task_recovery_pct"] == 100.0
    assert run_cli(capsys, "gate", run)[0] == 0  # its recipe's max_kld_mean 0.005
    code, out, _ = run_cli(capsys, "gate", run, "--max-kld", "1e-6", "--format", "json")
    assert code == 1 and json.loads(out)["passed"] is False
    assert json.loads((run / "manifest.json").read_text())["schema_version"] == 1  # read, not rewritten


def test_a_gguf_runs_one_off_conversion_has_its_own_column() -> None:
    """The F16 conversion (once per model, then cached) is not counted as quantization time."""
    from quantkit.report import table

    converted = synthetic_record("q8", "Q8_0", {"kld_mean": 0.01}, {"ppl": 10.0})
    converted.manifest.artifact.details["source_gguf"] = {"path": "/c/f16.gguf", "conversion_s": 50.0}
    converted.manifest.timings["quantize_s"] = 57.5
    cached = synthetic_record("q4", "Q4_K_M", {"kld_mean": 0.05}, {"ppl": 10.0})
    cached.manifest.artifact.details["source_gguf"] = {"path": "/c/f16.gguf", "conversion_s": None}
    cached.manifest.timings["quantize_s"] = 7.4
    comparison = table.build([converted, cached])
    rows = comparison.to_json()["rows"]
    assert [(r["quantize_s"], r["convert_s"]) for r in rows] == [(None, None), (7.5, 50.0), (7.4, None)]
    assert ("convert_s", "convert s") in comparison.columns()


@pytest.mark.parametrize("width", [80, 100, 120])
def test_the_report_of_real_runs_fits_the_terminal_with_whole_numbers(
    two_runs: list[Path], width: int
) -> None:
    """`quantkit report` in a terminal (issue #39): the view fits ``width`` and the KLD and Δppl
    of every run appear as the wide table writes them."""
    import io

    from rich.console import Console

    from quantkit.report import render, table
    from quantkit.report.table import format_cell
    from quantkit.results.store import load_run

    comparison = table.build([load_run(path) for path in two_runs])
    console = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    console.print(render.to_rich(comparison, width))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= width, text
    for row in comparison.rows:
        for key in ("ppl_increase_pct", "kld_mean"):
            assert format_cell(key, row.get(key)) in text, (key, text)
    assert "…" not in text


def test_report_columns_are_chosen_by_name_and_an_unknown_one_is_refused(
    two_runs: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "report", *two_runs, "--columns", "name,kld_mean,run_id")
    assert code == 0, err
    assert "KLD" in out and "run id" in out and "bits (quantized)" not in out and "Δppl" not in out
    code, out, err = run_cli(capsys, "report", *two_runs, "--columns", "name,kld")
    assert code == 2 and "unknown column 'kld'" in err and "kld_mean" in err, err


def test_the_html_report_fits_a_1280_px_window_and_plots_the_tables_bpw(
    two_runs: list[Path], tmp_path: Path
) -> None:
    """Issue #39: the page overflowed 1,400 px with a scroll bar. Its wide table now scrolls in
    its own box: in headless Chromium at 1,280 px the page is no wider than the window (a
    negative control without the box is). Plots put each run at the table's file bpw."""
    from quantkit.report import render, table
    from quantkit.results.store import load_run

    comparison = table.build([load_run(path) for path in two_runs])
    page = render.to_html(comparison)
    probe = (
        "<script>document.body.setAttribute('data-widths', "
        "document.documentElement.scrollWidth + ',' + window.innerWidth)</script></body>"
    )

    def widths(html: str, name: str) -> tuple[int, int]:
        path = tmp_path / name
        path.write_text(html.replace("</body>", probe), encoding="utf-8")
        dom = run_chromium(tmp_path, "--dump-dom", path.resolve().as_uri(), window="1280,900").stdout
        found = re.search(r'data-widths="(\d+),(\d+)"', dom)
        assert found, dom[-500:]
        return int(found.group(1)), int(found.group(2))

    scroll, window = widths(page, "fits.html")
    assert window == 1280 and scroll <= window, (scroll, window)
    unboxed = page.replace('class="table-scroll"', 'class="no-box"')
    scroll, window = widths(unboxed, "overflows.html")
    assert scroll > window, (scroll, window)  # the control: the same table without its box

    rows = comparison.rows
    fallback = _parse(plots.speed_vs_quality(rows))  # no bench: Δppl % against bits
    tips = [el.findtext(f"{SVG}title") or "" for el in _points(fallback)]
    for row in rows:
        assert any(f"file_bpw={row['file_bpw']:g}" in tip for tip in tips), (row["file_bpw"], tips)
