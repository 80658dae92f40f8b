from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_tiny_recipe

from quantkit.cli import main
from quantkit.inputs.models import fingerprint


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_help_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from quantkit.cli import main\n"
        "assert main(['--help']) == 0\n"
        "assert main(['recipes', 'list']) == 0\n"
        "heavy = [m for m in ('torch', 'transformers', 'llmcompressor', 'numpy') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_version(capsys) -> None:
    code, out, _ = run_cli(capsys, "--version")
    assert code == 0 and out.startswith("quantkit ")


@pytest.fixture(scope="module")
def _one_finished_run(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    folder = tmp_path_factory.mktemp("finished")
    out = folder / "run-a"
    assert main(["quantize", str(write_tiny_recipe(folder, tiny_model)), "--out", str(out)]) == 0
    return out


@pytest.fixture
def finished_run(_one_finished_run: Path, tmp_path: Path) -> Path:
    """A finished tiny FP8 run, quantized once for this module; each test gets its own copy."""
    out = tmp_path / "run-a"
    shutil.copytree(_one_finished_run, out)
    return out


def test_quantize_writes_a_complete_run(finished_run: Path, tiny_model: Path) -> None:
    manifest = json.loads((finished_run / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert manifest["recipe"]["method"] == "fp8"
    assert manifest["model"]["fingerprint"] == fingerprint(tiny_model)
    assert manifest["environment"]["libraries"]["llmcompressor"]
    assert manifest["environment"]["libraries"]["torch"]
    assert manifest["seeds"] == {"run": 0, "calibration": None}
    assert manifest["calibration"] is None  # FP8 dynamic is data-free
    assert len(manifest["eval"]["hash"]) == 64 and manifest["eval"]["windows"] == 4
    quantized = manifest["metrics"]["quantized"]
    assert quantized["kld_mean"]["value"] > 0 and quantized["kld_mean"]["higher_is_better"] is False
    assert quantized["top1_agreement_pct"]["higher_is_better"] is True
    assert manifest["metrics"]["baseline"]["ppl"]["value"] > 1
    assert manifest["gate"]["passed"] is True
    assert {"quantize_s", "eval_s", "total_s"} <= set(manifest["timings"])
    for name in ("recipe.yaml", "report.md", "report.json", "eval_windows.json", "artifact/config.json"):
        assert (finished_run / name).is_file(), name
    assert (finished_run / "artifact" / "quantkit-recipe.yaml").is_file()
    config = json.loads((finished_run / "artifact" / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "compressed-tensors"
    assert not (finished_run.parent / ".run-a.partial").exists()
    assert sorted(p.name for p in finished_run.parent.iterdir() if p.name.startswith(".")) == []


def test_source_model_is_untouched(tiny_model: Path, tmp_path: Path, tiny_recipe: Path, capsys) -> None:
    before = sorted((p.name, p.stat().st_mtime_ns) for p in tiny_model.iterdir())
    print_before = fingerprint(tiny_model)
    assert run_cli(capsys, "quantize", tiny_recipe, "--out", tmp_path / "r")[0] == 0
    assert sorted((p.name, p.stat().st_mtime_ns) for p in tiny_model.iterdir()) == before
    assert fingerprint(tiny_model) == print_before


def test_second_run_reuses_the_cached_reference(
    finished_run: Path, tiny_recipe: Path, tmp_path: Path, capsys
) -> None:
    code, _, _ = run_cli(
        capsys, "quantize", tiny_recipe, "--out", tmp_path / "run-b", "--set", "options.scheme=FP8_BLOCK"
    )
    assert code == 0
    first = json.loads((finished_run / "manifest.json").read_text())
    second = json.loads((tmp_path / "run-b" / "manifest.json").read_text())
    assert second["eval"]["reference_cached"] is True
    assert second["eval"]["reference_key"] == first["eval"]["reference_key"]
    assert "reference_s" not in second["timings"]
    assert second["artifact"]["scheme"] == "FP8_BLOCK"


def test_static_fp8_uses_calibration(tiny_recipe: Path, tmp_path: Path, capsys) -> None:
    code, _, err = run_cli(
        capsys, "quantize", tiny_recipe, "--out", tmp_path / "s", "--set", "options.scheme=FP8"
    )
    assert code == 0, err
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert manifest["calibration"]["windows"] == 4 and manifest["calibration"]["seq_len"] == 64
    assert len(manifest["calibration"]["hash"]) == 64


def test_json_format_is_machine_readable(tiny_recipe: Path, tmp_path: Path, capsys) -> None:
    code, out, _ = run_cli(capsys, "quantize", tiny_recipe, "--out", tmp_path / "j", "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert 1e-6 < data["manifest"]["metrics"]["quantized"]["kld_mean"]["value"] < 0.005  # FP8: ~9e-5


def test_default_out_goes_to_the_runs_folder(tiny_recipe: Path, tmp_path: Path, capsys) -> None:
    code, _, _ = run_cli(capsys, "quantize", tiny_recipe)
    assert code == 0
    runs = [p for p in (tmp_path / "runs").iterdir()]
    assert len(runs) == 1 and runs[0].name.endswith("-tiny-fp8")


def test_failing_recipe_gate_exits_1(tiny_recipe: Path, tmp_path: Path, capsys) -> None:
    code, _, err = run_cli(
        capsys, "quantize", tiny_recipe, "--out", tmp_path / "g", "--set", "gates.max_kld_mean=0"
    )
    assert code == 1
    assert "kld_mean" in err and "FAILED" in err
    assert (tmp_path / "g" / "manifest.json").is_file()  # the run is kept; the gate failed


def test_report_over_two_runs(finished_run: Path, tiny_recipe: Path, tmp_path: Path, capsys) -> None:
    assert (
        run_cli(
            capsys, "quantize", tiny_recipe, "--out", tmp_path / "b", "--set", "options.scheme=FP8_BLOCK"
        )[0]
        == 0
    )
    md, js = tmp_path / "cmp.md", tmp_path / "cmp.json"
    code, out, _ = run_cli(capsys, "report", finished_run, tmp_path / "b", "-o", md, "-o", js)
    assert code == 0
    assert "baseline" in out and "FP8_BLOCK" in out
    table = md.read_text()
    assert table.count("\n| ") == 4  # header + baseline + two runs
    data = json.loads(js.read_text())
    # runs are named by what they are: an option override is part of the name; ids are shown
    assert [row["name"] for row in data["rows"]] == ["baseline", "tiny-fp8", "tiny-fp8 [scheme=FP8_BLOCK]"]
    assert [row["run_id"] for row in data["rows"]] == [None, "run-a", "b"]
    assert "tiny-fp8 [scheme=FP8_BLOCK]" in out and "run-a" in out
    assert data["rows"][0]["kld_mean"] == 0.0 and data["rows"][1]["kld_mean"] > 0
    assert data["schema_version"] == 2 and len(data["groups"]) == 1


def test_report_refuses_unknown_extension(finished_run: Path, tmp_path: Path, capsys) -> None:
    code, _, err = run_cli(capsys, "report", finished_run, "-o", tmp_path / "x.pdf")
    assert code == 2 and "hint:" in err


def test_gate_cli(finished_run: Path, capsys) -> None:
    assert run_cli(capsys, "gate", finished_run, "--max-kld", "10", "--min-top1", "1%")[0] == 0
    code, out, _ = run_cli(capsys, "gate", finished_run, "--max-kld", "0")
    assert code == 1 and "FAIL" in out and "kld_mean" in out
    assert run_cli(capsys, "gate", finished_run)[0] == 0  # the recipe's own gates
    code, out, _ = run_cli(capsys, "gate", finished_run, "--max-ppl-increase", "-50%", "--format", "json")
    assert code == 1 and json.loads(out)["passed"] is False


def test_gate_missing_metric_fails(finished_run: Path, capsys) -> None:
    manifest_path = finished_run / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["metrics"]["quantized"]["kld_mean"]
    manifest_path.write_text(json.dumps(manifest))
    code, out, _ = run_cli(capsys, "gate", finished_run, "--max-kld", "10")
    assert code == 1 and "missing" in out


def test_gate_without_thresholds_is_a_usage_error(finished_run: Path, capsys) -> None:
    manifest_path = finished_run / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["recipe"]["gates"] = {}
    manifest_path.write_text(json.dumps(manifest))
    code, _, err = run_cli(capsys, "gate", finished_run)
    assert code == 2 and "no thresholds" in err


def test_interrupted_run_leaves_nothing(tiny_recipe: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    from quantkit.backends import fp8

    def boom(self, job):
        (job.out_dir).mkdir(parents=True, exist_ok=True)
        (job.out_dir / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(fp8.FP8Backend, "quantize", boom)
    code, _, err = run_cli(capsys, "quantize", tiny_recipe, "--out", tmp_path / "out" / "run")
    assert code == 130 and "interrupted" in err
    assert list((tmp_path / "out").iterdir()) == []


def test_ctrl_c_after_quantization_keeps_the_stages_and_the_rerun_resumes(
    tiny_recipe: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    import quantkit.evals.quality as quality

    real_score = quality.score

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    out = tmp_path / "out" / "run"
    monkeypatch.setattr(quality, "score", interrupted)
    code, _, err = run_cli(capsys, "quantize", tiny_recipe, "--out", out)
    assert code == 130 and "resume" in err
    partial = tmp_path / "out" / ".run.partial"
    progress = json.loads((partial / "progress.json").read_text())
    assert list(progress["stages"]) == ["reference", "quantize"]
    code, shown, _ = run_cli(capsys, "runs", "show", partial, "--format", "json")
    assert code == 0 and list(json.loads(shown)["completed"]) == ["reference", "quantize"]
    assert json.loads(shown)["running"] is False and json.loads(shown)["fingerprint"]["model"]
    monkeypatch.setattr(quality, "score", real_score)
    code, _, err = run_cli(capsys, "quantize", tiny_recipe, "--out", out)
    assert code == 0 and "quantization: resumed" in err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["resume"]["resumed_stages"] == ["reference", "quantize"]
    assert set(manifest["stages"]) == {"reference", "quantize", "evaluate"}
    assert not partial.exists()


def test_a_stray_file_in_a_kept_artifact_makes_it_quantized_again(
    tiny_recipe: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    import quantkit.evals.quality as quality

    real_score = quality.score
    monkeypatch.setattr(quality, "score", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    out = tmp_path / "run"
    assert run_cli(capsys, "quantize", tiny_recipe, "--out", out)[0] == 130
    (tmp_path / ".run.partial" / "artifact" / "stray.safetensors").write_bytes(b"x" * 100)
    monkeypatch.setattr(quality, "score", real_score)
    code, _, err = run_cli(capsys, "quantize", tiny_recipe, "--out", out)
    assert code == 0 and "quantization: resumed" not in err
    assert not (out / "artifact" / "stray.safetensors").exists()
    assert json.loads((out / "manifest.json").read_text())["resume"]["resumed_stages"] == ["reference"]


def test_restart_discards_the_interrupted_run_of_the_same_command(
    tiny_recipe: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    import quantkit.evals.quality as quality

    real_score = quality.score
    monkeypatch.setattr(quality, "score", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    assert run_cli(capsys, "quantize", tiny_recipe)[0] == 130
    runs = tmp_path / "runs"
    [partial] = list(runs.iterdir())
    assert partial.name.endswith(".partial")
    monkeypatch.setattr(quality, "score", real_score)
    code, _, err = run_cli(capsys, "quantize", tiny_recipe, "--restart")
    assert code == 0 and "resumed" not in err
    [run] = list(runs.iterdir())
    assert run.name == partial.name[1 : -len(".partial")]
    assert json.loads((run / "manifest.json").read_text())["resume"]["resumed_stages"] == []


def test_overwrite_replaces_only_when_complete(finished_run: Path, tiny_recipe: Path, capsys) -> None:
    old = json.loads((finished_run / "manifest.json").read_text())["run_id"]
    code, _, _ = run_cli(
        capsys, "quantize", tiny_recipe, "--out", finished_run, "--overwrite", "--set", "seed=1"
    )
    assert code == 0
    manifest = json.loads((finished_run / "manifest.json").read_text())
    assert manifest["seeds"]["run"] == 1 and manifest["run_id"] == old
    assert [p.name for p in finished_run.parent.iterdir() if p.name.startswith(".")] == []


def test_backends_list_and_info(capsys) -> None:
    code, out, _ = run_cli(capsys, "backends", "list", "--format", "json")
    assert code == 0 and "fp8" in {row["name"] for row in json.loads(out)}
    code, out, _ = run_cli(capsys, "backends", "info", "fp8", "--format", "json")
    assert code == 0
    assert json.loads(out)["options_schema"]["properties"]["scheme"]["default"] == "FP8_DYNAMIC"
    code, _, err = run_cli(capsys, "backends", "info", "fp9")
    assert code == 2 and "did you mean 'fp8'" in err


def test_recipes_show_and_validate(tmp_path: Path, capsys) -> None:
    code, out, _ = run_cli(capsys, "recipes", "show", "fp8-static", "--set", "calibration.num_samples=8")
    assert code == 0 and "num_samples: 8" in out
    code, out, _ = run_cli(capsys, "recipes", "list", "--format", "json")
    assert code == 0 and {row["name"] for row in json.loads(out)} >= {"fp8-dynamic", "fp8-static"}
    from quantkit.paths import recipes_dir

    assert run_cli(capsys, "recipes", "validate", *sorted(recipes_dir().glob("*.yaml")))[0] == 0


def test_per_window_scores_reproduce_the_metrics(finished_run: Path) -> None:
    import math

    windows = json.loads((finished_run / "eval_windows.json").read_text())
    manifest = json.loads((finished_run / "manifest.json").read_text())
    base = windows["baseline"]["nll_mean"]
    quant = windows["quantized"]["nll_mean"]
    assert len(base) == len(quant) == manifest["eval"]["windows"]
    baseline_ppl = manifest["metrics"]["baseline"]["ppl"]["value"]
    assert math.exp(sum(base) / len(base)) == pytest.approx(baseline_ppl, rel=1e-6)
    assert math.exp(sum(quant) / len(quant)) == pytest.approx(
        manifest["metrics"]["quantized"]["ppl"]["value"], rel=1e-6
    )
    kld = windows["quantized"]["kld_mean"]
    assert sum(kld) / len(kld) == pytest.approx(
        manifest["metrics"]["quantized"]["kld_mean"]["value"], rel=1e-6
    )


def test_second_half_protocol_is_recorded_and_reported_against_its_own_baseline(
    tmp_path: Path, tiny_recipe: Path, capsys
) -> None:
    full, half = tmp_path / "full", tmp_path / "half"
    assert main(["quantize", str(tiny_recipe), "--out", str(full), "--columns", "name,kld_mean"]) == 0
    table = capsys.readouterr().out  # the columns asked for, and no other
    assert "KLD" in table and "tiny-fp8" in table and "Δppl" not in table and "scheme" not in table
    assert main(["quantize", str(tiny_recipe), "--out", str(half), "--set", "eval.score=second_half"]) == 0
    a, b = (json.loads((run / "manifest.json").read_text()) for run in (full, half))
    assert (a["eval"]["score"], b["eval"]["score"]) == ("all", "second_half")
    assert b["eval"]["reference_cached"] is True  # one reference serves both protocols
    # 4 windows of 64 tokens: 63 predictions each, of which positions 32..62 (31) are scored
    assert (a["metrics"]["quantized"]["tokens"]["value"], b["metrics"]["quantized"]["tokens"]["value"]) == (
        4 * 63,
        4 * 31,
    )
    assert a["metrics"]["baseline"]["ppl"]["value"] != b["metrics"]["baseline"]["ppl"]["value"]
    capsys.readouterr()
    assert main(["report", str(full), str(half), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["groups"]) == 2 and [row["name"] for row in report["rows"]].count("baseline") == 2
    code = main(["quantize", str(tiny_recipe), "--out", str(tmp_path / "x"), "--set", "eval.score=half"])
    assert code == 2


# The lines quantkit itself writes to stderr in a human run: its header, stage progress (▶, ✓,
# indented steps), the saved path, gate lines, and its own warnings and errors.
_OWN_LINE = ("quantkit ", "▶ ", "✓ ", "  ", "run saved to ", "warning: ", "error: ", "hint: ")


def test_a_quantize_shows_quantkits_lines_only_and_verbose_shows_the_libraries(
    tiny_recipe: Path, tmp_path: Path, session_cache: Path
) -> None:
    """Issue #39: torchao's 'Failed to load' lines and torch's pytree warnings (torchao is
    GPTQModel's dependency, imported by compressed-tensors when present) no longer reach a
    user's terminal; -v shows them."""
    import os

    env = {**os.environ, "QUANTKIT_CACHE": str(session_cache)}
    command = [sys.executable, "-m", "quantkit", "quantize", str(tiny_recipe), "--no-bench"]
    quiet = subprocess.run([*command, "--out", str(tmp_path / "a")], capture_output=True, text=True, env=env)
    assert quiet.returncode == 0, quiet.stderr
    foreign = [line for line in quiet.stderr.splitlines() if line and not line.startswith(_OWN_LINE)]
    assert foreign == [], foreign
    for noise in ("Failed to load", "it/s]", "Warning", "_pytree"):
        assert noise not in quiet.stderr, noise
    loud = subprocess.run(
        [*command, "--out", str(tmp_path / "b"), "-v"], capture_output=True, text=True, env=env
    )
    assert loud.returncode == 0 and "Failed to load" in loud.stderr and "_pytree" in loud.stderr
    # what was hidden is in the run's library.log; with -v the log says where it went
    log = (tmp_path / "a" / "library.log").read_text()
    assert log.startswith("== ") and "quantize" in log.splitlines()[0]
    assert "WARNING torchao: Failed to load" in log and "_pytree" in log and "it/s]" not in log
    loud_log = (tmp_path / "b" / "library.log").read_text()
    assert "library output went to the terminal (-v)" in loud_log and "Failed to load" not in loud_log


@pytest.mark.parametrize("command", ["quantize", "sweep", "report"])
def test_an_unknown_column_is_refused_before_anything_runs(
    command: str, tiny_recipe: Path, tmp_path: Path, capsys
) -> None:
    """A misspelt --columns fails at once (exit 2), not after quantizing or sweeping."""
    out = tmp_path / "never"
    target = ["runs/none"] if command == "report" else [str(tiny_recipe), "--out", str(out)]
    code = main([command, *target, "--columns", "name,kld"])
    err = capsys.readouterr().err
    assert code == 2 and "error: unknown column 'kld'" in err and "hint: columns: " in err, err
    assert not out.exists()


_HELP_AT_80 = r"""
import json
import typer
from typer.testing import CliRunner
from quantkit.cli import app

root = typer.main.get_command(app)
problems, seen = [], 0

def visit(command, path):
    global seen
    if hasattr(command, "commands"):  # a group (typer vendors click: no click.Group to check)
        for name, sub in command.commands.items():
            visit(sub, [*path, name])
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=80, env={"COLUMNS": "80"})
    text = result.output
    seen += 1
    if result.exit_code != 0 or any(len(line) > 80 for line in text.splitlines()) or "…" in text:
        problems.append(" ".join(path) + ": " + text[:200])
    for param in command.params:
        for name in [*param.opts, *param.secondary_opts]:
            if name.startswith("--") and name not in text:
                problems.append(" ".join(path) + ": " + name + " not whole")

visit(root, [])
print(json.dumps({"commands": seen, "problems": problems}))
"""


def test_every_help_fits_80_columns_with_every_option_name_whole() -> None:
    """Issue #39: Typer's rich help cut '--allow-implausible-baseline' to '--allow-implausible…'
    at 80 columns; below 110 columns quantkit uses click's plain help, which wraps instead."""
    import os

    env = {**os.environ, "COLUMNS": "80"}
    result = subprocess.run([sys.executable, "-c", _HELP_AT_80], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["commands"] >= 14 and report["problems"] == [], report["problems"][:5]
