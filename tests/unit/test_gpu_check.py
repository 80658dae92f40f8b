"""bench/gpu_check.py (issue #16) without a GPU: it refuses to run without CUDA (exit 2, one
line), its carried wheels cover what the GPU machine lacks, its tolerance and time-box logic,
and its dry run on the CPU in an environment holding only the GPU machine's packages plus the
carried ones, which writes every section of its JSON with plausible figures."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
PY312 = {"python_version": "3.12", "python_full_version": "3.12.0", "sys_platform": "linux", "extra": ""}


def _load(name: str) -> ModuleType:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


wheels = _load("gpu_wheels")
parts = _load("gpu_parts")


def _requirements(name: str) -> list[str]:
    """The distributions ``name`` (installed here) requires on Linux, Python 3.12, no extras."""
    names = []
    for text in metadata.distribution(name).requires or []:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate(PY312):
            names.append(wheels.normalize(requirement.name))
    return names


def _closure(names: set[str]) -> set[str]:
    """``names`` and everything they require, as far as it is installed here."""
    seen: set[str] = set()
    stack = [wheels.normalize(name) for name in names]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        try:
            stack += _requirements(name)
        except metadata.PackageNotFoundError:  # on the GPU machine, not here (triton, tiktoken)
            continue
        seen.add(name)
    return seen


def test_the_carried_wheels_are_pinned_and_with_the_gpu_machine_cover_their_requirements() -> None:
    pinned = wheels.pins(ROOT / "constraints.txt")
    device = _closure(set(wheels.DEVICE))
    carried = {wheels.normalize(name) for name in wheels.CARRIED}
    assert not carried & set(wheels.DEVICE), "a package the machine has is carried"
    for name in carried:
        assert metadata.version(name) == pinned[name], name  # what the dry run below imports
        uncovered = set(_requirements(name)) - device - carried - set(wheels.NOT_NEEDED)
        assert uncovered == set(), f"{name} requires {uncovered}: carry them or say why not"


def test_wheels_are_downloaded_for_cpython_312_manylinux_without_dependencies(tmp_path: Path) -> None:
    command = wheels.download_command(["pydantic==2.14.4"], tmp_path)
    assert command[1:4] == ["-m", "pip", "download"]
    assert {"--no-deps", "--only-binary=:all:"} <= set(command)
    joined = " ".join(command)
    assert "--python-version 3.12 --implementation cp" in joined
    assert "--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64" in joined
    assert command[-1] == "pydantic==2.14.4"
    assert (
        wheels.wheel_name(Path("pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.whl"))
        == "pydantic-core"
    )
    assert "/.whl/" in (ROOT / ".gitignore").read_text().splitlines()  # never committed


def test_the_parity_tolerances_hold_and_fail() -> None:
    a = {"baseline_ppl": 100.0, "ppl": 110.0, "kld_mean": 0.010, "top1_agreement_pct": 90.0}
    close = {"baseline_ppl": 100.5, "ppl": 111.0, "kld_mean": 0.014, "top1_agreement_pct": 86.0}
    far = {"baseline_ppl": 102.0, "ppl": 115.0, "kld_mean": 0.030, "top1_agreement_pct": 80.0}
    assert parts.agreement(a, close) == dict.fromkeys(
        ("baseline_ppl", "ppl", "kld_mean", "top1_agreement_pct"), True
    )
    assert parts.agreement(a, far) == dict.fromkeys(
        ("baseline_ppl", "ppl", "kld_mean", "top1_agreement_pct"), False
    )
    assert parts.agreement(a, {**close, "ppl": None})["ppl"] is False  # a missing metric fails
    tiny = {"kld_mean": 1e-4}  # small KLDs: the absolute room (2e-3) applies
    assert parts.agreement(tiny, {"kld_mean": 1.5e-3})["kld_mean"] is True


def test_a_part_that_raises_is_recorded_and_one_without_time_is_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(plan: object, deadline: float) -> dict[str, object]:
        raise RuntimeError("CUDA error: out of memory\nmore")

    monkeypatch.setitem(parts.PART_FUNCTIONS, "parity", broken)
    clock = parts.Clock(time.perf_counter(), 600.0)
    record = parts.run_part("parity", None, clock)
    assert record["status"] == "error" and record["error"] == "RuntimeError: CUDA error: out of memory"
    assert record["allowed_s"] == parts.ALLOTMENTS["parity"].cap_s == 75 and record["seconds"] >= 0
    late = parts.Clock(time.perf_counter() - 590.0, 600.0)  # 10 s left; gptq_large needs 45
    skipped = parts.run_part("gptq_large", None, late)
    assert skipped["status"] == "skipped" and skipped["reason"].startswith("out of time: 10 s of the 600 s")


def test_gptq_stops_when_its_projected_end_passes_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real oneshot on a 4-layer tiny shape, told its time is up: it stops after the first
    layer (llm-compressor lets the exception through) and a later run still works."""
    monkeypatch.setitem(parts.SHAPES, "four", {**parts.SHAPES["tiny"], "num_hidden_layers": 4})
    plan = parts.make_plan(dry_run=True, work=tmp_path, recipes=[], sdist=None)
    stopped = parts.gptq_on_shape(plan, "four", time.perf_counter())
    assert (stopped["status"], stopped["layers_done"], stopped["layers"]) == ("out_of_time", 1, 4)
    assert stopped["projected_quantize_s"] >= stopped["quantize_s_so_far"] > 0
    done = parts.gptq_on_shape(plan, "tiny", time.perf_counter() + 120)
    assert done["status"] == "ok" and done["samples_per_s"] > 0
    assert os.environ.get("QUANTKIT_NO_BENCH") == "1"  # the parts leave the test process's settings


def test_the_large_gptq_falls_back_to_the_next_shape_with_a_reserve_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    deadlines: list[float] = []

    def attempt(plan: object, shape: str, deadline: float) -> dict[str, object]:
        deadlines.append(deadline)
        if shape == "llama-3-8b":
            return {"shape": shape, "status": "out_of_time", "projected_quantize_s": 400.0}
        return {"shape": shape, "status": "ok", "quantize_s": 30.0, "samples_per_s": 4.27}

    monkeypatch.setattr(parts, "gptq_on_shape", attempt)
    end = time.perf_counter() + 200
    record = parts.gptq_large(parts.make_plan(False, Path("/nonexistent"), [], None), end)
    assert record["status"] == "ok" and record["ran"] == "llama-3.2-1b" and record["quantize_s"] == 30.0
    assert [a["status"] for a in record["attempts"]] == ["out_of_time", "ok"]
    assert deadlines[1] == end and end - deadlines[0] == pytest.approx(50, abs=1)  # a quarter kept


def test_pytest_summaries_are_counted() -> None:
    assert parts.pytest_counts("...\n3 passed, 1 skipped in 9.1s\n") == {
        "passed": 3, "failed": 0, "skipped": 1, "errors": 0,
    }  # fmt: skip
    assert parts.pytest_counts("1 failed, 2 passed, 1 error in 3s") == {
        "passed": 2, "failed": 1, "skipped": 0, "errors": 1,
    }  # fmt: skip


def test_without_cuda_it_says_why_in_one_line_and_exits_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(BENCH / "gpu_check.py"), "--out", str(tmp_path)], capture_output=True, text=True
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "gpu_check: cannot run: no CUDA device is visible to torch "
        f"{_torch_version()} (torch.cuda.is_available() is False); it needs a CUDA machine "
        "(--dry-run-cpu: CPU parts)"
    ]
    assert list(tmp_path.iterdir()) == []
    make = subprocess.run(
        ["make", "-s", "gpu-check", f"PYTHON={sys.executable}"], cwd=ROOT, capture_output=True, text=True
    )
    assert make.returncode == 2 and "gpu_check: cannot run: no CUDA device" in make.stderr
    assert "pip install" not in make.stdout  # refused before installing anything


def _torch_version() -> str:
    import torch

    return torch.__version__


def _device_like_python(dest: Path) -> Path:
    """A venv holding only the GPU machine's packages (and what they require) plus the carried
    ones, linked from this environment's site-packages: what the check can import there."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    (site,) = dest.glob("lib/python*/site-packages")
    wanted = _closure(set(wheels.DEVICE)) | {wheels.normalize(name) for name in wheels.CARRIED}
    for name in sorted(wanted):
        dist = metadata.distribution(name)
        root = Path(str(dist.locate_file("")))
        tops = {Path(str(file)).parts[0] for file in dist.files or []}
        for top in tops - {"..", "__pycache__"}:
            if (root / top).exists() and not (site / top).exists():
                (site / top).symlink_to(root / top)
    return dest / "bin" / "python"


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    folder = tmp_path_factory.mktemp("gpu-check")
    python = _device_like_python(folder / "device-venv")
    hidden = subprocess.run([str(python), "-c", "import peft"], capture_output=True)
    assert hidden.returncode != 0  # installed here, not on the GPU machine: not importable there
    env = {
        key: value for key, value in os.environ.items() if not key.startswith(("QUANTKIT_", "VIRTUAL_ENV"))
    }
    env["PYTHONPATH"] = str(ROOT)
    out = folder / "out"
    command = [str(python), str(BENCH / "gpu_check.py"), "--dry-run-cpu", "--out", str(out)]
    # the data-free and a calibrated recipe (the default four take ~8 s more on 2 cores)
    command += ["--budget-s", "120", "--parity-recipes", "fp8-dynamic,gptq-w4a16-g128"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text()


def test_the_dry_run_writes_every_section_with_plausible_figures(dry_run: tuple[dict, str]) -> None:
    report, table = dry_run
    assert report["mode"] == "dry-run-cpu" and report["schema_version"] == 1
    assert list(report["parts"]) == ["gpu_tests", "parity", "gptq_large", "bench", "gguf_offload"]
    assert 0 < report["elapsed_s"] < report["budget_s"] == 120
    assert "random weights" in report["note"]
    assert report["machine"]["libraries"]["llmcompressor"] == metadata.version("llmcompressor")
    assert report["machine"]["requirement_conflicts"] == []
    p = report["parts"]

    tests = p["gpu_tests"]  # pytest ran them; without CUDA they skip themselves
    assert (tests["status"], tests["skipped"], tests["passed"]) == ("skipped", 3, 0)
    assert tests["reason"] == "the 3 gpu tests skipped themselves (no CUDA)"

    parity = p["parity"]
    assert parity["status"] == "ok" and parity["sides"] == ["cpu/float32", "cpu/bfloat16"]
    assert list(parity["recipes"]) == ["fp8-dynamic", "gptq-w4a16-g128"]
    for name, recipe in parity["recipes"].items():
        assert recipe["status"] == "ok" and all(recipe["checks"].values()), name
        a, b = recipe["sides"]["cpu/float32"], recipe["sides"]["cpu/bfloat16"]
        assert (a["baseline_dtype"], b["baseline_dtype"]) == ("float32", "bfloat16")
        assert a["baseline_ppl"] != b["baseline_ppl"]  # two precisions, two references
        for side in (a, b):
            assert 300 < side["baseline_ppl"] < 420 and math.isfinite(side["ppl"]), name  # ~uniform over 384
            assert 0 < side["kld_mean"] < 0.01 and side["top1_agreement_pct"] >= 90, name
    assert parity["recipes"]["fp8-dynamic"]["sides"]["cpu/float32"]["kld_mean"] < 1e-3

    large = p["gptq_large"]
    assert large["status"] == "ok" and large["ran"] == "tiny" and large["layers"] == 2
    assert (large["samples"], large["seq_len"]) == (4, 64) and large["quantize_s"] > 0
    assert large["samples_per_s"] == pytest.approx(4 / large["quantize_s"], rel=0.05)
    assert large["published"]["samples_per_s"] == pytest.approx(512 / 745, abs=1e-4)
    assert large["peak_allocated_bytes"] is None  # no CUDA memory on the CPU

    bench = p["bench"]
    assert bench["status"] == "ok" and bench["shape"] == "tiny" and bench["baseline_dtype"] == "float32"
    for side in ("baseline", "fp8"):
        figures = bench[side]
        assert figures["decode_tok_s"] > 0 and figures["prefill_tok_s"]["16"] > 0, side
        assert 0 < figures["ttft_s"]["16"] < 5 and figures["memory_kind"] == "rss", side
    assert bench["ratios"]["decode_speed_ratio"] > 0

    gguf = p["gguf_offload"]  # llama-cpp-python is not on the GPU machine, and its sdist is too big
    assert gguf["status"] == "skipped"
    assert gguf["reason"].startswith("llama-cpp-python is not installed; no llama-cpp-python sdist was given")

    assert "| parity | ok |" in table and "| gguf_offload | skipped |" in table
