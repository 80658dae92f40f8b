"""Each bad input: exit 2, one 'error:' line plus a hint, no traceback, nothing left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def quantkit(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QUANTKIT_RUNS_DIR": str(cwd / "runs")}
    return subprocess.run(
        [sys.executable, "-m", "quantkit", *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env
    )


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
    result = quantkit("quantize", "fp8-dynamic", "--model", "./does/not/exist", cwd=tmp_path)
    assert_clean_failure(result, "not found", tmp_path)


def test_folder_that_is_not_a_causal_lm(tmp_path: Path) -> None:
    folder = tmp_path / "bert"
    folder.mkdir()
    write(folder / "config.json", json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"]}))
    result = quantkit("quantize", "fp8-dynamic", "--model", folder, cwd=tmp_path)
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
    assert_clean_failure(quantkit("quantize", recipe, cwd=tmp_path), "empty", tmp_path)


def test_calibration_shorter_than_one_sample(tmp_path: Path, tiny_model: Path) -> None:
    short = write(tmp_path / "short.txt", "only a handful of words")
    recipe = tiny(
        tmp_path, tiny_model, f"options: {{scheme: FP8}}\ncalibration: {{source: {short}, seq_len: 128}}\n"
    )
    assert_clean_failure(quantkit("quantize", recipe, cwd=tmp_path), "shorter than one window", tmp_path)


def test_output_folder_exists(tmp_path: Path, tiny_model: Path) -> None:
    out = tmp_path / "existing"
    out.mkdir()
    write(out / "keep.txt", "mine")
    result = quantkit("quantize", tiny(tmp_path, tiny_model), "--out", out, cwd=tmp_path)
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
    result = quantkit("quantize", tiny(tmp_path, tiny_model), "--device", "cuda", cwd=tmp_path)
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
    result = quantkit("quantize", "fp8-dynamic", "--model", folder, "--device", "cpu", cwd=tmp_path)
    assert_clean_failure(result, "not a valid safetensors file", tmp_path)


def test_truncated_safetensors(tmp_path: Path, tiny_model: Path) -> None:
    folder = _copy_model(tiny_model, tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    result = quantkit("quantize", "fp8-dynamic", "--model", folder, "--device", "cpu", cwd=tmp_path)
    assert_clean_failure(result, "corrupt or truncated", tmp_path)


def test_calibration_file_with_invalid_utf8(tmp_path: Path, tiny_model: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine text " * 50 + b"\xff\xfe broken")
    recipe = tiny(tmp_path, tiny_model, f"options: {{scheme: FP8}}\ncalibration: {{source: {bad}}}\n")
    assert_clean_failure(quantkit("quantize", recipe, cwd=tmp_path), "not valid UTF-8", tmp_path)


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
    result = quantkit("quantize", "fp8-dynamic", "--model", folder, cwd=tmp_path)
    assert_clean_failure(result, "trust_remote_code", tmp_path)
