"""`quantkit sweep` on the tiny random Llama: one folder, one baseline computed once, one
report; reruns keep verified runs and refuse a changed spec; a failing run does not stop the
others; the local executor's process-per-run path gives the same metrics; bad input."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from quantkit.cli import main

# evaluation settings used by no other test module: the reference is computed by this sweep
TINY = [
    "--set", "eval.num_windows=3", "--set", "eval.seq_len=64", "--set", "eval.top_k=8",
    "--set", "calibration.num_samples=4", "--set", "calibration.seq_len=64", "--device", "cpu",
]  # fmt: skip
BENCH = [
    "--bench", "--set", "bench.prompt_lengths=[16]", "--set", "bench.decode_tokens=4",
    "--set", "bench.repeats=1", "--set", "bench.batch_size=1",
]  # fmt: skip
RECIPES = ["fp8-dynamic", "rtn-w4a16-g64", "gptq-w4a16-g128"]


def run_cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    code = main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def sweep_manifest(folder: Path) -> dict:
    return json.loads((folder / "sweep.json").read_text())


def run_manifest(folder: Path, run_id: str) -> dict:
    return json.loads((folder / "runs" / run_id / "manifest.json").read_text())


@pytest.fixture(scope="module")
def swept(tiny_model: Path, session_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three recipes swept with bench on (tiny settings), through the CLI in this process."""
    folder = tmp_path_factory.mktemp("sweep") / "three"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("QUANTKIT_CACHE", str(session_cache))
        code = main(["sweep", *RECIPES, "--model", str(tiny_model), *TINY, *BENCH, "--out", str(folder)])
    assert code == 0
    return folder


def test_three_recipes_share_one_baseline_computed_once(swept: Path) -> None:
    manifest = sweep_manifest(swept)
    assert [run["run_id"] for run in manifest["runs"]] == RECIPES
    assert [run["state"] for run in manifest["runs"]] == ["done"] * 3
    (baseline,) = manifest["baselines"]
    assert baseline["runs"] == RECIPES
    assert baseline["reference_computed"] is True and baseline["bench_sides_measured"] == 1
    assert baseline["dtype"] == "float32"  # the baseline's precision (auto, on the CPU)
    shared_bench = list((swept / "baseline").glob("bench-*.json"))
    assert len(shared_bench) == 1
    measured_once = json.loads(shared_bench[0].read_text())
    for run_id in RECIPES:
        run = run_manifest(swept, run_id)
        assert run["resume"]["resumed_stages"] == []
        assert run["eval"]["reference_cached"] is True, run_id  # the sweep computed it before fan-out
        assert run["eval"]["reference_key"] == baseline["reference_key"]
        assert "reference_s" not in run["timings"]
        assert run["bench"]["shared"] == ["baseline"], run_id  # not measured again by the run
        assert run["bench"]["baseline"] == measured_once
        assert 0 < run["metrics"]["quantized"]["kld_mean"]["value"] < 0.05
    counts = {"runs": 3, "done": 3, "failed": 0, "baselines": 1, "references_computed": 1}
    assert {key: manifest_counts(manifest)[key] for key in counts} == counts


def manifest_counts(manifest: dict) -> dict[str, int]:
    from quantkit.sweep.record import SweepManifest

    return SweepManifest.model_validate(manifest).counts()


def test_the_sweep_report_has_one_baseline_row(swept: Path) -> None:
    report = json.loads((swept / "report.json").read_text())
    assert len(report["groups"]) == 1
    assert [(row["name"], row["group"]) for row in report["rows"]] == [("baseline", 0)] + [
        (r, 0) for r in RECIPES
    ]
    markdown = (swept / "report.md").read_text()
    assert markdown.count("| baseline |") == 1
    assert "<svg" in (swept / "report.html").read_text()


def test_a_rerun_keeps_verified_runs_and_redoes_a_damaged_one(
    swept: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(swept, folder)
    before = {run_id: (folder / "runs" / run_id / "manifest.json").stat().st_mtime_ns for run_id in RECIPES}
    weights = folder / "runs" / "rtn-w4a16-g64" / "artifact" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes: only the checksum can tell
    weights.write_bytes(bytes(data))
    args = ["sweep", *RECIPES, "--model", tiny_model, *TINY, *BENCH, "--out", folder]
    code, _out, err = run_cli(capsys, *args)
    assert code == 0, err
    manifest = sweep_manifest(folder)
    assert [run["kept"] for run in manifest["runs"]] == [True, False, True]
    after = {run_id: (folder / "runs" / run_id / "manifest.json").stat().st_mtime_ns for run_id in RECIPES}
    assert (
        after["fp8-dynamic"] == before["fp8-dynamic"]
        and after["gptq-w4a16-g128"] == before["gptq-w4a16-g128"]
    )
    assert after["rtn-w4a16-g64"] != before["rtn-w4a16-g64"]
    assert manifest["runs"][1]["kld"] == pytest.approx(
        run_manifest(swept, "rtn-w4a16-g64")["metrics"]["quantized"]["kld_mean"]["value"]
    )
    assert manifest["baselines"][0]["reference_computed"] is False


def test_a_changed_spec_is_refused_and_nothing_is_touched(
    swept: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = (swept / "sweep.json").read_text()
    args = [
        "sweep",
        *RECIPES,
        "--model",
        tiny_model,
        *TINY,
        *BENCH,
        "--set",
        "eval.num_windows=4",
        "--out",
        swept,
    ]
    code, _, err = run_cli(capsys, *args)
    assert code == 2
    expected = "the sweep changed since the runs in this folder were made: "
    expected += "run 'fp8-dynamic' now has a different eval"
    assert f"error: {expected}" in err
    assert "hint: give a new --out folder" in err
    assert (swept / "sweep.json").read_text() == before


def test_a_failing_run_does_not_stop_the_others(
    tiny_model: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    folder = tmp_path / "partly"
    args = ["sweep", "rtn-w4a16-g64", "--grid", "options.group_size=256,32", "--model", tiny_model, *TINY]
    code, _out, err = run_cli(capsys, *args, "--no-bench", "--out", folder)
    assert code == 2  # the failed run was refused as bad input (no gate failed, nothing internal)
    runs = sweep_manifest(folder)["runs"]
    assert [(run["state"], run["exit_code"]) for run in runs] == [("failed", 2), ("done", 0)]
    assert runs[0]["error"] == "options.group_size=256 does not divide hidden_size=128"
    assert "failed rtn-w4a16-g64 [group_size=256]: options.group_size=256 does not divide" in err
    assert "run 'rtn-w4a16-g64 [group_size=256]' failed" in (folder / "report.md").read_text()
    assert [path.name for path in (folder / "runs").iterdir()] == ["rtn-w4a16-g64-group_size=32"]


def test_gates_failing_in_a_sweep_exit_1(
    tiny_model: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = ["sweep", "rtn-w4a16-g64", "--model", tiny_model, *TINY, "--set", "gates.max_kld_mean=0.00001"]
    code, out, _err = run_cli(capsys, *args, "--no-bench", "--out", tmp_path / "gated", "--format", "json")
    assert code == 1
    data = json.loads(out)
    assert [(run["state"], run["gate_passed"]) for run in data["manifest"]["runs"]] == [("done", False)]


def test_runs_in_processes_of_their_own_give_the_same_metrics(
    swept: Path, tiny_model: Path, session_cache: Path, tmp_path: Path
) -> None:
    """--jobs 2: the path that pins one run per GPU, here on the CPU (cores split)."""
    env = {**os.environ, "QUANTKIT_CACHE": str(session_cache)}
    args = ["sweep", *RECIPES[:2], "--model", tiny_model, *TINY, "--no-bench", "--jobs", "2"]
    result = subprocess.run(
        [sys.executable, "-m", "quantkit", *map(str, args), "--out", str(tmp_path / "jobs")],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    manifest = sweep_manifest(tmp_path / "jobs")
    assert "2 runs at once, each in its own process" in manifest["executor"]
    assert len({run["host"] + str(run["path"]) for run in manifest["runs"]}) == 2
    for run in manifest["runs"]:
        expected = run_manifest(swept, run["run_id"])["metrics"]["quantized"]
        got = run_manifest(tmp_path / "jobs", run["run_id"])["metrics"]["quantized"]
        for key in ("ppl", "kld_mean", "kld_p99", "top1_agreement_pct"):
            assert got[key]["value"] == expected[key]["value"], (run["run_id"], key)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize(
    ("args", "message", "hint"),
    [
        (["gptq-w4a16-g129"], "error: recipe 'gptq-w4a16-g129' not found", "did you mean"),
        (
            ["gptq-w4a16-g128", "--grid", "options.group_sise=32,64"],
            "unknown field 'options.group_sise'",
            "group_size",
        ),
        (
            ["gptq-w4a16-g128", "--grid", "options.group_size="],
            "grid 'options.group_size' has no values",
            "list",
        ),
        (
            ["fp8-dynamic", "--ray", "127.0.0.1:{port}", "--out", "{abs}"],
            "no Ray cluster answers at 127.0.0.1:",
            "ray start",
        ),
        (["fp8-dynamic", "--ray", "auto", "--out", "relative/sweep"], "is a relative path", "--out /shared"),
    ],
)
def test_bad_sweeps_exit_2_and_leave_nothing(
    args: list[str],
    message: str,
    hint: str,
    tiny_model: Path,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "out"
    filled = [arg.format(port=_closed_port(), abs=target) for arg in args]
    code, _out, err = run_cli(capsys, "sweep", *filled, "--model", tiny_model, *TINY)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 2 and message in lines[0] and lines[1].startswith("hint:") and hint in lines[1], err
    assert sorted(path.name for path in tmp_path.iterdir()) == []


def test_the_lm_eval_baseline_is_computed_once_before_fan_out(
    tiny_model: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    folder = tmp_path / "tasks"
    task = (
        "evals=[{lm_eval: {tasks: [quantkit_cloze], limit: 5, batch_size: 4}}]"  # a limit no other test uses
    )
    args = [
        "sweep",
        "fp8-dynamic",
        "rtn-w4a16-g64",
        "--model",
        tiny_model,
        *TINY,
        "--set",
        task,
        "--no-bench",
    ]
    code, _, err = run_cli(capsys, *args, "--out", folder)
    assert code == 0, err
    manifest = sweep_manifest(folder)
    assert manifest["baselines"][0]["lm_eval_computed"] == 1
    for run_id in ("fp8-dynamic", "rtn-w4a16-g64"):
        (section,) = run_manifest(folder, run_id)["lm_eval"]
        assert section["baseline_cached"] is True, run_id
        assert section["settings"]["limit"] == 5
