"""`quantkit sweep` on the embedded SmolLM2 (the done-means of the sweep issue): three recipes,
one sweep folder and report, the baseline reference and the baseline bench computed once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantkit.cli import main

pytestmark = pytest.mark.slow

RECIPES = ["fp8-dynamic", "rtn-w4a16-g64", "gguf-q8_0"]
# KLD bounds a broken artifact cannot reach (measured here: 0.034 / 0.49 / 0.005; baseline ppl 22.8)
MAX_KLD = {"fp8-dynamic": 0.05, "rtn-w4a16-g64": 0.8, "gguf-q8_0": 0.02}
# 6 windows: an eval set no other module uses, so this sweep computes its reference
BUDGET = [
    "--set", "eval.num_windows=6", "--set", "eval.seq_len=256", "--device", "cpu",
    "--bench", "--set", "bench.prompt_lengths=[32]", "--set", "bench.decode_tokens=8",
    "--set", "bench.repeats=1", "--set", "bench.batch_size=1",
]  # fmt: skip


def test_three_recipes_on_smollm2_against_one_baseline(smollm2: Path, tmp_path: Path) -> None:
    folder = tmp_path / "sweep"
    assert main(["sweep", *RECIPES, *BUDGET, "--out", str(folder)]) == 0
    manifest = json.loads((folder / "sweep.json").read_text())
    assert [(run["run_id"], run["state"]) for run in manifest["runs"]] == [(r, "done") for r in RECIPES]
    (baseline,) = manifest["baselines"]
    assert baseline["reference_computed"] is True and baseline["bench_sides_measured"] == 1
    for run in manifest["runs"]:
        run_manifest = json.loads((folder / "runs" / run["run_id"] / "manifest.json").read_text())
        assert run_manifest["eval"]["reference_cached"] is True
        assert run_manifest["eval"]["reference_key"] == baseline["reference_key"]
        assert run_manifest["bench"]["shared"] == ["baseline"]
        metrics = run_manifest["metrics"]
        assert 10 < metrics["baseline"]["ppl"]["value"] < 30  # a real model on English text
        assert 0 < metrics["quantized"]["kld_mean"]["value"] < MAX_KLD[run["run_id"]], run["run_id"]
        assert run["kld"] == metrics["quantized"]["kld_mean"]["value"]
    gguf = json.loads((folder / "runs" / "gguf-q8_0" / "manifest.json").read_text())["bench"]
    assert gguf["runtime_baseline"]["runtime"] == "llamacpp"  # F16 GGUF in llama.cpp, by this run
    report = json.loads((folder / "report.json").read_text())
    assert len(report["groups"]) == 1
    assert [row["name"] for row in report["rows"]] == ["baseline", *RECIPES]
    assert (folder / "report.md").read_text().count("| baseline |") == 1
