"""``baseline.dtype``: the baseline's precision, chosen in the recipe, recorded, keyed and reported.

On the tiny model (near-uniform logits, ppl ≈ 357 of a 384 vocabulary) bfloat16 and float16
move the baseline's ppl by ~3e-5 relative to float32 (measured 356.865 / 356.877 / 356.865);
the tolerance below is 1e-3: close, but not the same number.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from quantkit.cli import main
from quantkit.evals import perf
from quantkit.results.manifest import BenchSide

PPL_REL_TOLERANCE = 1e-3  # bf16/fp16 arithmetic against fp32 on the tiny model (measured ~3e-5)


def _manifest(run: Path) -> dict[str, object]:
    return json.loads((run / "manifest.json").read_text())


def _fake_side(settings: perf.WorkerSettings) -> BenchSide:
    return BenchSide(
        runtime=settings.runtime,
        path=settings.path,
        load_s=1.0,
        prefill_tok_s={"16": 100.0},
        ttft_s={"16": 0.1},
        decode_tok_s=50.0,
        rss_before_load_bytes=0,
        weights_memory_bytes=1000,
        peak_memory_bytes=2000,
        memory_kind="rss",
        threads=1,
    )


def test_bfloat16_baseline_is_recorded_keyed_benched_and_reported_apart(
    tiny_recipe: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[perf.WorkerSettings] = []

    def worker(settings: perf.WorkerSettings) -> BenchSide:
        asked.append(settings)
        return _fake_side(settings)

    monkeypatch.setattr(perf, "_worker", worker)  # the bench's processes: what they were asked
    bench = ["--bench", "--set", "bench.prompt_lengths=[16]", "--set", "bench.batch_size=1"]
    fp32, bf16 = tmp_path / "fp32", tmp_path / "bf16"
    assert main(["quantize", str(tiny_recipe), "--out", str(fp32), *bench]) == 0
    assert (
        main(["quantize", str(tiny_recipe), "--out", str(bf16), "--set", "baseline.dtype=bfloat16", *bench])
        == 0
    )
    a, b = _manifest(fp32), _manifest(bf16)
    assert a["recipe"]["baseline"] == {"dtype": "auto"} and b["recipe"]["baseline"] == {"dtype": "bfloat16"}
    assert a["baseline"] == {"dtype": "float32", "weight_bits": 32.0}  # auto on the CPU, resolved
    assert b["baseline"] == {"dtype": "bfloat16", "weight_bits": 16.0}
    # the float32 reference is not reused for the bfloat16 baseline
    assert a["eval"]["reference_key"] != b["eval"]["reference_key"]
    assert b["eval"]["reference_cached"] is False and "reference_s" in b["timings"]
    ppl_a = a["metrics"]["baseline"]["ppl"]["value"]
    ppl_b = b["metrics"]["baseline"]["ppl"]["value"]
    assert ppl_a != ppl_b and math.isclose(ppl_a, ppl_b, rel_tol=PPL_REL_TOLERANCE)
    # the bench measured the baseline (and the artifact in transformers) in the run's precision
    assert [(s.runtime, s.dtype) for s in asked] == [
        ("hf", "float32"),
        ("hf", "float32"),
        ("hf", "bfloat16"),
        ("hf", "bfloat16"),
    ]
    assert (a["bench"]["settings"]["dtype"], b["bench"]["settings"]["dtype"]) == ("float32", "bfloat16")

    capsys.readouterr()
    assert main(["report", str(fp32), str(bf16), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [group["baseline_dtype"] for group in report["groups"]] == ["float32", "bfloat16"]
    baselines = [row for row in report["rows"] if row["name"] == "baseline"]
    assert [(row["scheme"], row["group"]) for row in baselines] == [("float32", 0), ("bfloat16", 1)]
    assert [row["ppl"] for row in baselines] == [ppl_a, ppl_b]
    md = tmp_path / "report.md"
    assert main(["report", str(fp32), str(bf16), "-o", str(md)]) == 0
    headings = [line for line in md.read_text().splitlines() if line.startswith("## ")]
    assert len(headings) == 2
    assert "(float32 baseline" in headings[0] and "(bfloat16 baseline" in headings[1]


def test_float16_baseline_runs_on_the_cpu(tiny_recipe: Path, tmp_path: Path) -> None:
    out = tmp_path / "fp16"
    assert main(["quantize", str(tiny_recipe), "--out", str(out), "--set", "baseline.dtype=float16"]) == 0
    manifest = _manifest(out)
    assert manifest["baseline"] == {"dtype": "float16", "weight_bits": 16.0}
    baseline = manifest["metrics"]["baseline"]["ppl"]["value"]
    assert math.isfinite(baseline) and 300 < baseline < 400  # near-uniform over 384 ids
    assert 0 < manifest["metrics"]["quantized"]["kld_mean"]["value"] < 0.01


def test_an_unknown_baseline_dtype_is_one_error_line_naming_the_field(
    tiny_recipe: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main(["quantize", str(tiny_recipe), "--out", str(out), "--set", "baseline.dtype=fp17"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-2] == (
        "error: tiny.yaml: invalid value for 'baseline.dtype': Input should be 'auto', 'float32', "
        "'bfloat16' or 'float16' (got 'fp17')"
    )
    assert lines[-1] == "hint: fix the value in the recipe or with --set"
    assert not out.exists()
