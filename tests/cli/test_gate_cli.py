"""`quantkit gate` on a real tiny run (quantized once per module, copied per test)."""

from __future__ import annotations

import json
import math
import shutil
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import write_tiny_recipe

from quantkit.cli import main


def run_cli(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str, str]:
    code = main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def base_run(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, session_cache: Path
) -> Iterator[Path]:
    """One FP8-dynamic run of the tiny model (its recipe gates: max_kld_mean 0.005)."""
    folder = tmp_path_factory.mktemp("gate-cli")
    recipe = write_tiny_recipe(folder, tiny_model, num_windows=6, batch_size=3)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("QUANTKIT_CACHE", str(session_cache))
        patch.setenv("QUANTKIT_NO_BENCH", "1")
        assert main(["quantize", str(recipe), "--out", str(folder / "run")]) == 0
    yield folder / "run"


@pytest.fixture
def run_a(base_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(base_run, tmp_path / "run-a"))


@pytest.fixture
def run_b(base_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(base_run, tmp_path / "run-b"))


def _manifest(run: Path) -> dict[str, Any]:
    return json.loads((run / "manifest.json").read_text())


def _edit_manifest(run: Path, **metrics: float | None) -> None:
    """Set (or, with None, delete) quantized metric values in a run's manifest."""
    manifest = _manifest(run)
    quantized = manifest["metrics"]["quantized"]
    for name, value in metrics.items():
        if value is None:
            quantized.pop(name, None)
        else:
            quantized[name] = {"value": value, "higher_is_better": False, "unit": "", "description": ""}
    (run / "manifest.json").write_text(json.dumps(manifest))


def _shift_nll(run: Path, deltas: list[float]) -> float:
    """Add per-window deltas to the quantized NLL; keep the manifest's ppl increase consistent."""
    path = run / "eval_windows.json"
    windows = json.loads(path.read_text())
    quant = [q + d for q, d in zip(windows["quantized"]["nll_mean"], deltas, strict=True)]
    windows["quantized"]["nll_mean"] = quant
    path.write_text(json.dumps(windows))
    base = windows["baseline"]["nll_mean"]
    increase = 100 * (math.exp(sum(quant) / len(quant)) / math.exp(sum(base) / len(base)) - 1)
    _edit_manifest(run, ppl_increase_pct=increase)
    return increase


def _gate_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gates.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _checks(out: str, run_index: int = 0) -> dict[str, dict[str, Any]]:
    data = json.loads(out)
    return {check["metric"]: check for check in data["runs"][run_index]["checks"]}


def test_passing_gate(run_a: Path, capsys) -> None:
    code, out, err = run_cli(capsys, "gate", run_a, "--max-kld", "10", "--min-top1", "1%")
    assert code == 0, err
    assert "kld_mean" in out and "top1_agreement_pct" in out and "PASS" in out and "FAIL" not in out
    assert "gate passed" in err


def test_failing_gate_names_the_check_value_and_threshold(run_a: Path, capsys) -> None:
    value = _manifest(run_a)["metrics"]["quantized"]["kld_mean"]["value"]
    assert value > 0
    code, out, err = run_cli(capsys, "gate", run_a, "--max-kld", "1e-12", "--min-top1", "1%")
    assert code == 1
    assert "kld_mean" in out and "FAIL" in out
    assert f"kld_mean = {value:.6g} (required <= 1e-12)" in err and "FAILED" in err
    assert "top1_agreement_pct" not in err  # only the failing check is repeated on stderr


def test_missing_metric_fails(run_a: Path, capsys) -> None:
    code, out, err = run_cli(capsys, "gate", run_a, "--min-decode-speed-ratio", "1.1")
    assert code == 1
    assert "decode_speed_ratio" in out and "missing" in out
    assert "decode_speed_ratio: missing (required >= 1.1)" in err


def test_benchmark_metrics_when_present(run_a: Path, capsys) -> None:
    _edit_manifest(run_a, decode_speed_ratio=1.3, peak_memory_bytes=2.5e9, task_recovery_pct=99.0)
    args = ["--min-decode-speed-ratio", "1.2", "--min-task-recovery", "98%", "--format", "json"]
    code, out, _ = run_cli(capsys, "gate", run_a, *args, "--max-peak-memory", "3GB")
    assert code == 0
    assert _checks(out)["peak_memory_bytes"]["threshold"] == 3e9
    code, out, _ = run_cli(capsys, "gate", run_a, *args, "--max-peak-memory", "2GiB")
    assert code == 1 and not _checks(out)["peak_memory_bytes"]["passed"]
    code, _, err = run_cli(capsys, "gate", run_a, "--max-peak-memory", "lots")
    assert code == 2 and "not a size" in err


def test_gate_file_with_a_typo(run_a: Path, tmp_path: Path, capsys) -> None:
    gates = _gate_file(tmp_path, "max_kld_mean: 0.5\nmax_ppl_increse_pct: 5\n")
    code, out, err = run_cli(capsys, "gate", run_a, "--gate-file", gates)
    assert code == 2 and out == ""
    assert "unknown field 'max_ppl_increse_pct'" in err
    assert "did you mean 'max_ppl_increase_pct'?" in err


def test_malformed_gate_file(run_a: Path, tmp_path: Path, capsys) -> None:
    gates = _gate_file(tmp_path, "max_kld_mean: 0.5\nmin_top1_pct: [90\n")
    code, _, err = run_cli(capsys, "gate", run_a, "--gate-file", gates)
    assert code == 2 and "malformed YAML at line 3" in err and "hint: fix the YAML" in err
    code, _, err = run_cli(capsys, "gate", run_a, "--gate-file", tmp_path / "missing.yaml")
    assert code == 2 and "cannot read" in err


def test_precedence_flags_over_file_over_recipe(run_a: Path, tmp_path: Path, capsys) -> None:
    # the recipe alone: max_kld_mean 0.005 passes
    code, out, _ = run_cli(capsys, "gate", run_a, "--format", "json")
    assert code == 0 and _checks(out)["kld_mean"]["source"] == "recipe"
    assert _checks(out)["kld_mean"]["threshold"] == 0.005
    # the gate file overrides the recipe's max_kld_mean and adds a threshold
    gates = _gate_file(tmp_path, "max_kld_mean: 1.0e-12\nmin_top1_pct: 10\n")
    code, out, _ = run_cli(capsys, "gate", run_a, "--gate-file", gates, "--format", "json")
    checks = _checks(out)
    assert (
        code == 1 and checks["kld_mean"]["threshold"] == 1e-12 and checks["kld_mean"]["source"] == "gate-file"
    )
    assert checks["top1_agreement_pct"]["source"] == "gate-file"
    # a flag overrides the gate file, the file's other thresholds still apply
    code, out, _ = run_cli(capsys, "gate", run_a, "--gate-file", gates, "--max-kld", "10", "--format", "json")
    checks = _checks(out)
    assert code == 0 and checks["kld_mean"]["threshold"] == 10 and checks["kld_mean"]["source"] == "flag"
    assert checks["top1_agreement_pct"]["source"] == "gate-file"
    # an explicit null in the gate file clears the recipe's threshold
    gates = _gate_file(tmp_path, "max_kld_mean: null\nmin_top1_pct: 10\n")
    code, out, _ = run_cli(capsys, "gate", run_a, "--gate-file", gates, "--format", "json")
    assert code == 0 and set(_checks(out)) == {"top1_agreement_pct"}


def test_junit_and_markdown_over_two_runs_one_failing(
    run_a: Path, run_b: Path, tmp_path: Path, capsys
) -> None:
    _edit_manifest(run_b, kld_mean=5.0)  # above the recipe's max_kld_mean 0.005
    junit, md = tmp_path / "gate.xml", tmp_path / "gate.md"
    code, out, err = run_cli(
        capsys, "gate", run_a, run_b, "--min-top1", "1%", "--junit", junit, "--markdown", md
    )
    assert code == 1
    assert "1 of 2 run(s)" in err and f"{run_b}: kld_mean = 5" in err
    assert str(run_a) in out and str(run_b) in out

    root = ET.fromstring(junit.read_text(encoding="utf-8"))
    assert (root.get("tests"), root.get("failures")) == ("4", "1")
    suites = root.findall("testsuite")
    assert [(s.get("name"), s.get("tests"), s.get("failures")) for s in suites] == [
        (str(run_a), "2", "0"),
        (str(run_b), "2", "1"),
    ]
    failures = [case for case in suites[1].findall("testcase") if case.find("failure") is not None]
    assert [case.get("name") for case in failures] == ["kld_mean"]
    message = failures[0].find("failure").get("message")  # type: ignore[union-attr]
    assert "kld_mean = 5" in message and "<= 0.005" in message

    text = md.read_text(encoding="utf-8")
    assert text.startswith("## quantkit gate: failed")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) == 4
    assert any(f"`{run_b}` | `kld_mean` | 5 nats | ≤ 0.005 nats |" in row and "FAIL" in row for row in rows)
    assert not list(tmp_path.glob(".gate.*.tmp"))  # written atomically, nothing left behind

    code, out, _ = run_cli(capsys, "gate", run_a, run_b, "--format", "json")
    data = json.loads(out)
    assert code == 1 and data["passed"] is False
    assert [run["passed"] for run in data["runs"]] == [True, False]


def test_significance_clear_pass_on_the_real_run(run_a: Path, capsys) -> None:
    code, out, _ = run_cli(
        capsys, "gate", run_a, "--max-ppl-increase", "50%", "--require-significance", "--format", "json"
    )
    checks = _checks(out)
    assert code == 0
    low, high = checks["ppl_increase_pct"]["interval"]
    assert low <= checks["ppl_increase_pct"]["value"] <= high and high < 50
    assert checks["ppl_increase_pct"]["verdict"] == "pass" and checks["kld_mean"]["interval"]
    assert json.loads(out)["runs"][0]["significance"]["windows"] == 6


def test_significance_clear_regression_fails(run_a: Path, capsys) -> None:
    increase = _shift_nll(run_a, [0.2] * 6)  # every window ~22% worse
    assert increase > 20
    code, out, _ = run_cli(
        capsys, "gate", run_a, "--max-ppl-increase", "5%", "--require-significance", "--format", "json"
    )
    check = _checks(out)["ppl_increase_pct"]
    assert code == 1 and check["verdict"] == "fail" and check["interval"][0] > 5


def test_significance_inconclusive_passes_unless_strict(run_a: Path, tmp_path: Path, capsys) -> None:
    increase = _shift_nll(run_a, [0.1, -0.1, 0.1, -0.1, 0.12, -0.08])  # noisy, slightly worse
    assert increase > 0
    # by the point value alone, a 0% ceiling fails
    assert run_cli(capsys, "gate", run_a, "--max-ppl-increase", "0%")[0] == 1
    code, out, err = run_cli(
        capsys, "gate", run_a, "--max-ppl-increase", "0%", "--require-significance", "--format", "json"
    )
    check = _checks(out)["ppl_increase_pct"]
    assert code == 0, err
    assert check["verdict"] == "inconclusive" and check["passed"] is True
    assert check["interval"][0] < 0 < check["interval"][1]
    # strict: from a flag, and from a gate file
    code, out, _ = run_cli(
        capsys, "gate", run_a, "--max-ppl-increase", "0%", "--require-significance", "--strict-inconclusive"
    )
    assert code == 1 and "inconclusive (fail)" in out
    gates = _gate_file(
        tmp_path,
        "max_ppl_increase_pct: 0\nrequire_significance: true\nstrict_inconclusive: true\n"
        "confidence: 0.9\nbootstrap_samples: 500\nseed: 3\n",
    )
    code, out, _ = run_cli(capsys, "gate", run_a, "--gate-file", gates, "--format", "json")
    significance = json.loads(out)["runs"][0]["significance"]
    assert code == 1 and significance["confidence"] == 0.9 and significance["bootstrap_samples"] == 500
    assert run_cli(capsys, "gate", run_a, "--gate-file", gates, "--no-strict-inconclusive")[0] == 0


def test_significance_needs_per_window_scores(run_a: Path, capsys) -> None:
    (run_a / "eval_windows.json").unlink()
    code, _, err = run_cli(capsys, "gate", run_a, "--max-kld", "1", "--require-significance")
    assert code == 2 and "eval_windows.json" in err
    assert run_cli(capsys, "gate", run_a, "--max-kld", "1")[0] == 0  # not required: point values


def test_bad_significance_options(run_a: Path, capsys) -> None:
    code, _, err = run_cli(capsys, "gate", run_a, "--max-kld", "1", "--confidence", "150%")
    assert code == 2 and "confidence" in err
    code, out, _ = run_cli(capsys, "gate", run_a, "--max-kld", "1", "--confidence", "90%", "--format", "json")
    assert code == 0 and json.loads(out)["runs"][0]["significance"]["confidence"] == 0.9


def test_bad_run_among_several_is_a_usage_error(run_a: Path, tmp_path: Path, capsys) -> None:
    junit = tmp_path / "gate.xml"
    code, _, err = run_cli(capsys, "gate", run_a, tmp_path / "nope", "--junit", junit)
    assert code == 2 and "not found" in err
    assert not junit.exists()  # nothing evaluated or written on bad input
    code, _, err = run_cli(capsys, "gate", run_a, "--junit", junit, "--markdown", tmp_path / "no" / "g.md")
    assert code == 2 and "no folder" in err and not junit.exists()


def test_help_says_which_thresholds_are_relative(capsys) -> None:
    code, out, _ = run_cli(capsys, "gate", "--help")
    assert code == 0
    text = " ".join(out.split())
    assert "Relative to the baseline" in text and "Absolute" in text and "--gate-file" in text
