"""The terminal view (issue #39): laid out to the terminal's width, numbers never cut."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from quantkit.errors import UserInputError
from quantkit.report.render import to_rich
from quantkit.report.table import Comparison, Group
from quantkit.report.terminal import DEFAULT_VIEW, table_width, view_columns


def _comparison(measured: bool = True) -> Comparison:
    baseline = {
        "name": "baseline",
        "scheme": "float32",
        "file_bpw": 16.0,
        "disk_bytes": 269_060_000,
        "ppl_increase_pct": 0.0,
        "kld_mean": 0.0,
        "top1_agreement_pct": 100.0,
        "decode_speed_ratio": 1.0 if measured else None,
        "peak_memory_bytes": 612_300_000 if measured else None,
    }
    runs = [
        {
            "name": "gguf-q4_k_m-ffn-down-q8-imatrix-long-name",
            "scheme": "Q4_K_M+overrides",
            "file_bpw": 6.165,
            "disk_bytes": 104_980_000,
            "ppl_increase_pct": 12.3456,
            "kld_mean": 0.0577123,
            "top1_agreement_pct": 88.4321,
            "decode_speed_ratio": 2.345 if measured else None,
            "peak_memory_bytes": 301_200_000 if measured else None,
            "gate_passed": False,
        },
        {
            "name": "fp8-dynamic",
            "scheme": "FP8_DYNAMIC",
            "file_bpw": 8.761,
            "disk_bytes": 162_500_000,
            "ppl_increase_pct": -0.0123,
            "kld_mean": 0.00312,
            "top1_agreement_pct": 97.9,
            "decode_speed_ratio": 0.62 if measured else None,
            "peak_memory_bytes": 488_000_000 if measured else None,
            "gate_passed": True,
        },
    ]
    group = Group(
        model="smollm2-135m",
        device="cpu",
        baseline_dtype="float32",
        eval_hash="ab" * 32,
        rows=[baseline, *runs],
    )
    return Comparison(groups=[group], warnings=[])


def _render(comparison: Comparison, width: int, **kwargs: object) -> str:
    console = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    console.print(to_rich(comparison, width, **kwargs))  # type: ignore[arg-type]
    return console.export_text()


# the cells of every default column as the view prints them, per row
WHOLE = {
    "ppl_increase_pct": ["+0.00", "+12.35", "-0.01"],
    "kld_mean": ["0", "0.05771", "0.00312"],
    "decode_speed_ratio": ["1.00×", "2.35×", "0.62×"],
    "gate": ["pass", "FAIL"],
    "name": ["baseline", "gguf-q4_k_m-ff…rix-long-name", "fp8-dynamic"],  # 28 at most, cut in the middle
}


@pytest.mark.parametrize("width", [80, 100, 120, 140])
def test_the_view_fits_and_every_shown_number_is_whole(width: int) -> None:
    comparison = _comparison()
    text = _render(comparison, width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, text
    assert "…" not in text.replace("gguf-q4_k_m-ff…rix-long-name", ""), (
        text
    )  # only the long name is shortened
    for cells in WHOLE.values():  # never dropped
        for cell in cells:
            assert cell in text, (cell, text)
    shown = {column.key for column in view_columns(comparison, None)}
    optional = {
        "scheme": ["float32", "Q4_K_M+overrides", "FP8_DYNAMIC"],
        "file_bpw": ["16", "6.17", "8.76"],
        "disk_bytes": ["269.1 MB", "105.0 MB", "162.5 MB"],
        "size_ratio": ["1.00×", "0.39×", "0.60×"],
        "top1_agreement_pct": ["100.00", "88.43", "97.90"],
        "peak_memory_bytes": ["612.3 MB", "301.2 MB", "488.0 MB"],
    }
    headings = {column.key: column.heading for column in DEFAULT_VIEW}
    present = [
        key for key in optional if f" {headings[key]} " in lines[2] or f"┃ {headings[key]} " in lines[2]
    ]
    for key in present:
        for cell in optional[key]:
            assert cell in text, (key, cell, text)
    assert shown >= {"decode_speed_ratio", "peak_memory_bytes", "gate"}
    if width == 120:  # 137 columns wanted: peak memory and the size ratio go first
        assert present == ["scheme", "file_bpw", "disk_bytes", "top1_agreement_pct"]
    if width == 140:
        assert present == list(optional)
    if width == 80:
        assert "peak_memory_bytes" not in present and "size_ratio" not in present


def test_below_the_cut_off_each_run_is_a_block_of_whole_numbers() -> None:
    text = _render(_comparison(), 44)
    assert "┃" not in text and max(len(line) for line in text.splitlines()) <= 44, text
    assert "\nfp8-dynamic\n" in text and "  KLD       0.00312\n" in text, text
    assert "  size      105.0 MB\n" in text and "  gate      FAIL\n" in text, text


def test_columns_unmeasured_are_left_out_and_columns_can_be_chosen() -> None:
    comparison = _comparison(measured=False)
    assert "decode_speed_ratio" not in {column.key for column in view_columns(comparison, None)}
    text = _render(comparison, 100, columns=["name", "kld_mean", "run_id"])
    assert "KLD" in text and "run id" in text and "Δppl" not in text
    with pytest.raises(UserInputError, match="unknown column 'kld'"):
        view_columns(comparison, ["kld"])


def test_wide_and_piped_output_keep_every_column() -> None:
    comparison = _comparison()
    wide = _render(comparison, 400, wide=True)
    assert "bits (quantized)" in wide and "KLD p99" in wide
    console = Console(width=1000, file=io.StringIO(), record=True, color_system=None)
    console.print(to_rich(comparison))  # no terminal width: today's full table
    assert "bits (quantized)" in console.export_text()
    assert table_width(view_columns(comparison, None)[:1], [["abc"]]) == 3 + 3 + 1
