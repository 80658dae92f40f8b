"""Fault tests: kill -9 a real quantize process at named points, resume, compare with a clean run.

``QUANTKIT_FAILPOINT`` makes the process SIGKILL itself at that point (see quantkit/util/faults.py):
no ``finally`` runs, exactly as with the OOM killer or a power cut.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

GPTQ_TINY = [
    "gptq-w4a16-g128", "--set", "calibration.num_samples=4", "--set", "calibration.seq_len=64",
    "--set", "eval.num_windows=4", "--set", "eval.seq_len=64", "--set", "eval.top_k=8",
    "--set", "options.group_size=32", "--device", "cpu",
]  # fmt: skip


def quantkit(
    *args: object, cwd: Path, cache: Path, failpoint: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QUANTKIT_CACHE": str(cache), "QUANTKIT_RUNS_DIR": str(cwd / "runs")}
    env.pop("QUANTKIT_FAILPOINT", None)
    if failpoint:
        env["QUANTKIT_FAILPOINT"] = failpoint
    return subprocess.run(
        [sys.executable, "-m", "quantkit", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=600,
    )


def files_of(folder: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``folder``."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def kept_stages(partial: Path) -> dict[str, str]:
    """The partial folder's files, less the lock (which names the last process that held it)."""
    return {name: digest for name, digest in files_of(partial).items() if name != ".lock"}


def manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


@pytest.fixture(scope="module")
def clean_run(tiny_model: Path, session_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same GPTQ run, never interrupted."""
    cwd = tmp_path_factory.mktemp("clean")
    result = quantkit(
        "quantize", *GPTQ_TINY, "--model", tiny_model, "--out", cwd / "run", cwd=cwd, cache=session_cache
    )
    assert result.returncode == 0, result.stderr
    return cwd / "run"


def killed_then_resumed(
    failpoint: str, tiny_model: Path, cwd: Path, cache: Path, *extra: object
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = cwd / "run"
    args = ("quantize", *GPTQ_TINY, "--model", tiny_model, "--out", out, *extra)
    killed = quantkit(*args, cwd=cwd, cache=cache, failpoint=failpoint)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not out.exists(), "a killed run left something that looks complete"
    assert (cwd / ".run.partial" / "progress.json").is_file()
    resumed = quantkit(*args, cwd=cwd, cache=cache)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert not (cwd / ".run.partial").exists()
    return out, resumed


def assert_same_as_clean(run: Path, clean: Path) -> None:
    resumed, reference = manifest(run), manifest(clean)
    assert resumed["metrics"] == reference["metrics"]
    assert files_of(run / "artifact") == files_of(clean / "artifact")
    assert folder_bytes(run / "artifact") <= folder_bytes(clean / "artifact")
    assert resumed["stages"]["quantize"]["files"] == reference["stages"]["quantize"]["files"]


@pytest.mark.parametrize(
    "failpoint",
    [
        "quantize.layer=1",  # during quantization
        "save.weights",  # while saving: weights written, tokenizer not
    ],
)
def test_kill_during_quantization_or_saving_then_resume(
    failpoint: str, clean_run: Path, tiny_model: Path, session_cache: Path, tmp_path: Path
) -> None:
    run, _ = killed_then_resumed(failpoint, tiny_model, tmp_path, session_cache)
    assert_same_as_clean(run, clean_run)
    assert "quantize" not in manifest(run)["resume"]["resumed_stages"]


def test_kill_after_quantization_resumes_without_quantizing_again(
    clean_run: Path, tiny_model: Path, session_cache: Path, tmp_path: Path
) -> None:
    run, resumed = killed_then_resumed("before.evaluate", tiny_model, tmp_path, session_cache)
    assert_same_as_clean(run, clean_run)
    assert "quantize" in manifest(run)["resume"]["resumed_stages"]
    assert "quantization: resumed" in resumed.stderr


def test_a_damaged_artifact_is_quantized_again(
    clean_run: Path, tiny_model: Path, session_cache: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    args = ("quantize", *GPTQ_TINY, "--model", tiny_model, "--out", out)
    killed = quantkit(*args, cwd=tmp_path, cache=session_cache, failpoint="before.manifest")
    assert killed.returncode == -signal.SIGKILL
    stages = json.loads((tmp_path / ".run.partial" / "progress.json").read_text())["stages"]
    assert list(stages) == ["reference", "quantize", "evaluate"]
    weights = tmp_path / ".run.partial" / "artifact" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # flipped bits in the last tensor: same size, wrong checksum
    weights.write_bytes(bytes(data))
    resumed = quantkit(*args, cwd=tmp_path, cache=session_cache)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    # the artifact is made again, and so is everything measured on the damaged one
    assert manifest(out)["resume"]["resumed_stages"] == ["reference"]
    assert_same_as_clean(out, clean_run)


def test_resuming_a_different_recipe_is_refused(
    tiny_model: Path, session_cache: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    args = ("quantize", *GPTQ_TINY, "--model", tiny_model, "--out", out)
    killed = quantkit(*args, cwd=tmp_path, cache=session_cache, failpoint="before.evaluate")
    assert killed.returncode == -signal.SIGKILL
    kept = kept_stages(tmp_path / ".run.partial")
    other = quantkit(*args, "--set", "options.dampening_frac=0.05", cwd=tmp_path, cache=session_cache)
    assert other.returncode == 2 and "Traceback" not in other.stderr
    error = [line for line in other.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "different recipe.options" in error[0], other.stderr
    assert "--restart" in other.stderr
    assert kept_stages(tmp_path / ".run.partial") == kept, "a refused resume touched the kept stages"
    restarted = quantkit(
        *args, "--set", "options.dampening_frac=0.05", "--restart", cwd=tmp_path, cache=session_cache
    )
    assert restarted.returncode == 0, restarted.stderr[-2000:]
    assert manifest(out)["resume"]["resumed_stages"] == []  # started over (the reference is shared)
    assert manifest(out)["recipe"]["options"]["dampening_frac"] == 0.05


def test_same_command_resumes_in_the_runs_folder(
    tiny_model: Path, session_cache: Path, tmp_path: Path
) -> None:
    args = ("quantize", *GPTQ_TINY, "--model", tiny_model)
    killed = quantkit(*args, cwd=tmp_path, cache=session_cache, failpoint="before.evaluate")
    assert killed.returncode == -signal.SIGKILL
    listing = quantkit("runs", "list", "--format", "json", cwd=tmp_path, cache=session_cache)
    leftovers = json.loads(listing.stdout)["leftovers"]
    assert len(leftovers) == 1 and leftovers[0]["stages"] == ["reference", "quantize"]
    assert leftovers[0]["running"] is False
    resumed = quantkit(*args, cwd=tmp_path, cache=session_cache)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    runs = [p for p in (tmp_path / "runs").iterdir()]
    assert len(runs) == 1 and runs[0].name == leftovers[0]["folder"][1 : -len(".partial")]
    assert "quantize" in manifest(runs[0])["resume"]["resumed_stages"]


def test_a_live_run_is_neither_joined_nor_cleaned(
    tiny_model: Path, session_cache: Path, tmp_path: Path
) -> None:
    partial = tmp_path / "runs" / ".run.partial"
    partial.mkdir(parents=True)
    with (partial / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running quantize would
        busy = quantkit(
            "quantize",
            *GPTQ_TINY,
            "--model",
            tiny_model,
            "--out",
            partial.parent / "run",
            cwd=tmp_path,
            cache=session_cache,
        )
        assert busy.returncode == 2 and "another quantkit process" in busy.stderr, busy.stderr
        cleaned = quantkit("runs", "clean", "--older-than", "0", cwd=tmp_path, cache=session_cache)
        assert cleaned.returncode == 0 and partial.is_dir()
    cleaned = quantkit("runs", "clean", "--older-than", "0", cwd=tmp_path, cache=session_cache)
    assert cleaned.returncode == 0 and not partial.exists()


def test_kill_while_replacing_a_run_then_resume(
    clean_run: Path, tiny_model: Path, session_cache: Path, tmp_path: Path
) -> None:
    """--overwrite: killed after the old run was moved aside, before the new one took its
    place. The rerun finishes from the journal; the old run is listed as a replaced leftover."""
    out = tmp_path / "run"
    args = ("quantize", *GPTQ_TINY, "--model", tiny_model, "--out", out, "--overwrite")
    first = quantkit(*args, "--set", "seed=7", cwd=tmp_path, cache=session_cache)
    assert first.returncode == 0, first.stderr[-2000:]
    killed = quantkit(*args, cwd=tmp_path, cache=session_cache, failpoint="commit.rename")
    assert killed.returncode == -signal.SIGKILL
    assert not out.exists() and len(list(tmp_path.glob(".run.old-*"))) == 1
    resumed = quantkit(*args, cwd=tmp_path, cache=session_cache)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert manifest(out)["resume"]["resumed_stages"] == ["reference", "quantize", "evaluate"]
    assert_same_as_clean(out, clean_run)
    assert not (out / "progress.json").exists() and not (out / ".lock").exists()
    listing = quantkit(
        "runs", "list", "--dir", tmp_path, "--format", "json", cwd=tmp_path, cache=session_cache
    )
    [leftover] = json.loads(listing.stdout)["leftovers"]
    assert leftover["kind"] == "replaced" and leftover["folder"].startswith(".run.old-")
