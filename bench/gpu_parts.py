"""The parts of bench/gpu_check.py, each a function of the plan and its deadline that returns a
JSON-able record with a ``status``: ok | failed (ran; a check did not hold) | error (raised) |
skipped (with a ``reason``). Only the standard library is imported at module level: the check
must say why it cannot run before anything else is imported."""

from __future__ import annotations

import datetime as dt
import math
import os
import platform
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from quantkit.results.manifest import Manifest

ROOT = Path(__file__).resolve().parents[1]
Record = dict[str, object]

NOTE = (
    "Speed and memory are measured on models with random weights built from a config (Llama-3-8B "
    "and Llama-3.2-1B shapes): they need no trained weights. Quality parity is measured on a tiny "
    "random Llama, where it checks the arithmetic, not a model's accuracy."
)
PARITY_RECIPES = ("fp8-dynamic", "gptq-w4a16-g128", "awq-w4a16-g128", "rtn-w4a16-g64")
# bf16 against fp32 arithmetic on the tiny random Llama (its logits are near-uniform: ppl ~359
# over 384 ids). Measured in the dry run (CPU fp32 vs CPU bf16, 2 x 64 eval tokens, the four
# recipes): baseline ppl within 2e-4 relative, artifact ppl within 2e-4, KLD within 2.5e-5
# (KLDs 8e-5 to 1e-3), top-1 equal; the tolerances leave room for CUDA's bf16 kernels and for
# quantizing in bf16 there.
TOLERANCES: dict[str, float] = {
    "baseline_ppl_rel": 0.01,
    "ppl_rel": 0.02,
    "kld_abs": 0.002,
    "kld_rel": 0.5,
    "top1_points": 5.0,
}
PUBLISHED = {
    "source": "llm-compressor's published GPTQ W4A16 time for Llama-3-8B on one GPU (quoted in issue #16)",
    "wall_s": 745.0,
    "samples": 512,
    "seq_len": 2048,
    "samples_per_s": round(512 / 745, 4),
}
SHAPES: dict[str, dict[str, object]] = {
    "llama-3-8b": {
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
    },
    "llama-3.2-1b": {
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
    },
    "tiny": {
        "vocab_size": 384,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": True,
    },
}


@dataclass(frozen=True)
class Sizes:
    """How big each part is: the GPU's sizes, or tiny ones for the dry run."""

    parity_overrides: tuple[str, ...]
    large_shapes: tuple[str, ...]  # tried in order: a later one when an earlier would not fit
    large_samples: int
    large_seq_len: int
    bench_shape: str
    bench_overrides: tuple[str, ...]


GPU_SIZES = Sizes(
    parity_overrides=(
        "eval.num_windows=4", "eval.seq_len=64", "eval.top_k=8",
        "calibration.num_samples=8", "calibration.seq_len=64",
    ),
    large_shapes=("llama-3-8b", "llama-3.2-1b"),
    large_samples=128,
    large_seq_len=2048,
    bench_shape="llama-3.2-1b",
    bench_overrides=(
        "eval.num_windows=2", "eval.seq_len=64", "eval.top_k=8", "bench.prompt_lengths=[128, 2048]",
        "bench.decode_tokens=64", "bench.repeats=3", "bench.batch_size=8",
    ),
)  # fmt: skip
DRY_SIZES = Sizes(
    parity_overrides=(
        "eval.num_windows=2", "eval.seq_len=64", "eval.top_k=8",
        "calibration.num_samples=4", "calibration.seq_len=64",
    ),
    large_shapes=("tiny",),
    large_samples=4,
    large_seq_len=64,
    bench_shape="tiny",
    bench_overrides=(
        "eval.num_windows=2", "eval.seq_len=32", "eval.top_k=8", "bench.prompt_lengths=[16]",
        "bench.decode_tokens=4", "bench.repeats=1", "bench.batch_size=2",
    ),
)  # fmt: skip


@dataclass(frozen=True)
class Side:
    """Where one side of the parity runs: device and ``baseline.dtype``."""

    device: str
    dtype: str

    @property
    def label(self) -> str:
        return f"{self.device}/{self.dtype}"


@dataclass(frozen=True)
class Plan:
    """What the check runs: on CUDA, or the dry run on the CPU at tiny sizes."""

    dry_run: bool
    device: str  # where the GPU parts run ("cpu" in the dry run)
    work: Path
    sizes: Sizes
    recipes: tuple[str, ...]
    sides: tuple[Side, Side]  # reference side, GPU side
    sdist: Path | None


@dataclass(frozen=True)
class Clock:
    """The whole check's budget: ``budget_s`` from ``start`` (``time.perf_counter``)."""

    start: float
    budget_s: float

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.start)


@dataclass(frozen=True)
class Allotment:
    """A part's share of the budget: at most ``cap_s``; skipped with less than ``min_s`` left."""

    cap_s: float
    min_s: float


ALLOTMENTS = {
    "gpu_tests": Allotment(90, 30),
    "parity": Allotment(75, 20),
    "gptq_large": Allotment(250, 45),
    "bench": Allotment(120, 40),
    "gguf_offload": Allotment(600, 0),  # what is left; it decides itself whether it can start
}


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def isolate(work: Path) -> None:
    """quantkit's cache and runs inside ``work``, the hub offline, library logs quiet (this
    process and the ones it starts)."""
    os.environ["QUANTKIT_CACHE"] = str(work / "cache")
    os.environ["QUANTKIT_RUNS_DIR"] = str(work / "runs")
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[name] = "1"
    os.environ.pop("QUANTKIT_NO_BENCH", None)  # the bench part asks for its stage explicitly
    from quantkit.util.progress import quiet_libraries

    quiet_libraries(False)


def make_plan(dry_run: bool, work: Path, recipes: list[str], sdist: Path | None) -> Plan:
    """What runs where: on CUDA, or on the CPU at tiny sizes for the dry run."""
    device = "cpu" if dry_run else "cuda"
    gpu_side = Side("cpu", "bfloat16") if dry_run else Side("cuda", "bfloat16")
    return Plan(
        dry_run=dry_run,
        device=device,
        work=work,
        sizes=DRY_SIZES if dry_run else GPU_SIZES,
        recipes=tuple(recipes),
        sides=(Side("cpu", "float32"), gpu_side),
        sdist=sdist,
    )


def not_chosen() -> Record:
    return {"status": "skipped", "reason": "not chosen (--parts)", "seconds": None}


def run_part(name: str, plan: Plan, clock: Clock) -> Record:
    """Run one part within its allotment; record what it raised instead of raising."""
    allotment = ALLOTMENTS[name]
    left = clock.left()
    if left < allotment.min_s:
        reason = f"out of time: {left:.0f} s of the {clock.budget_s:.0f} s budget left"
        reason += f", it needs {allotment.min_s:.0f} s"
        return {"status": "skipped", "reason": reason, "seconds": None}
    allowed = min(allotment.cap_s, left)
    start = time.perf_counter()
    print(f"gpu_check: {name} (up to {allowed:.0f} s)", file=sys.stderr, flush=True)
    part: Callable[[Plan, float], Record] = PART_FUNCTIONS[name]
    from quantkit.util.progress import library_bars_hidden

    try:
        with library_bars_hidden(False):  # the device run's output tail is kept short
            record = part(plan, start + allowed)
    except Exception as err:  # one part's failure is recorded; the others still run
        record = {"status": "error", "error": _describe(err), "traceback": traceback.format_exc()[-3000:]}
    record["seconds"] = round(time.perf_counter() - start, 1)
    record["allowed_s"] = round(allowed, 1)
    print(f"gpu_check: {name}: {record['status']} in {record['seconds']} s", file=sys.stderr, flush=True)
    return record


def _describe(err: BaseException) -> str:
    message = getattr(err, "message", None) or str(err)
    hint = getattr(err, "hint", "")
    first = message.strip().splitlines()[0] if message.strip() else ""
    return f"{type(err).__name__}: {first}" + (f" (hint: {hint})" if hint else "")


# --- machine ------------------------------------------------------------------------------------


def machine(device: str) -> Record:
    """Python, library versions and the GPU."""
    import torch

    from quantkit.util.environment import library_versions

    info: Record = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "libraries": dict(library_versions()),
        "requirement_conflicts": requirement_conflicts(),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = {"name": props.name, "memory_bytes": int(props.total_memory)}
    return info


def requirement_conflicts() -> list[str]:
    """Requirements of the carried packages that the machine's own versions do not meet
    (installed with --no-deps, so pip never checked them; e.g. an older typing-extensions)."""
    from importlib import metadata

    from gpu_wheels import CARRIED
    from packaging.requirements import Requirement

    conflicts = []
    for name in CARRIED:
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            conflicts.append(f"{name} is not installed")
            continue
        for text in requires:
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            try:
                version = metadata.version(requirement.name)
            except metadata.PackageNotFoundError:
                continue  # a package the check never imports (auto-round)
            if not requirement.specifier.contains(version, prereleases=True):
                conflicts.append(f"{name} requires {requirement}, found {version}")
    return conflicts


def machine_summary(device: str) -> str:
    import torch

    if device == "cuda":
        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    return f"CPU only, torch {torch.__version__}"


# --- gpu_tests ----------------------------------------------------------------------------------


def gpu_tests(plan: Plan, deadline: float) -> Record:
    """The ``gpu``-marked tests, in a pytest process of their own."""
    command = [sys.executable, "-m", "pytest", "tests/cli/test_cuda.py", "-m", "gpu", "-q", "-rfEs"]
    command += ["-p", "no:cacheprovider", "-o", "addopts="]
    timeout = max(deadline - time.perf_counter(), 1.0)
    try:
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        out = err.stdout if isinstance(err.stdout, str) else ""
        return {
            "status": "error",
            "error": f"pytest timed out after {timeout:.0f} s",
            "output_tail": out[-2000:],
        }
    counts = pytest_counts(result.stdout)
    record: Record = {**counts, "exit_code": result.returncode, "output_tail": result.stdout[-2000:]}
    if plan.dry_run and result.returncode == 0 and counts["skipped"] and not counts["passed"]:
        return record | {
            "status": "skipped",
            "reason": f"the {counts['skipped']} gpu tests skipped themselves (no CUDA)",
        }
    ok = result.returncode == 0 and counts["passed"] > 0 and not counts["failed"] and not counts["errors"]
    return record | {"status": "ok" if ok else "failed"}


def pytest_counts(output: str) -> dict[str, int]:
    """passed / failed / skipped / errors from pytest's summary line."""
    lines = [line for line in output.splitlines() if re.search(r"\b(passed|failed|skipped|error)", line)]
    last = lines[-1] if lines else ""
    counts = {}
    for key, pattern in (
        ("passed", "passed"),
        ("failed", "failed"),
        ("skipped", "skipped"),
        ("errors", "errors?"),
    ):
        match = re.search(rf"(\d+) {pattern}\b", last)
        counts[key] = int(match.group(1)) if match else 0
    return counts


# --- parity -------------------------------------------------------------------------------------


def _tiny_model(plan: Plan) -> Path:
    from quantkit.util.testing import make_tiny_llama

    folder = plan.work / "tiny-llama"
    if not (folder / "config.json").is_file():
        make_tiny_llama(folder)
    return folder


def _quantize(
    recipe: str, overrides: list[str], model: Path, out: Path, device: str, bench: bool = False
) -> Manifest:
    """One quantkit run through its pipeline (the baseline guard let through: random models)."""
    from quantkit.inputs.recipe import load_recipe
    from quantkit.run.pipeline import QuantizeRequest, run_quantize

    request = QuantizeRequest(
        recipe=load_recipe(recipe, overrides),
        model=str(model),
        out=out,
        overwrite=True,
        device=device,
        bench=bench,
        allow_implausible_baseline=True,
    )
    return run_quantize(request).record.manifest


def _quality(manifest: Manifest) -> dict[str, float | str | None]:
    quantized = manifest.metrics.values("quantized")
    return {
        "baseline_dtype": manifest.baseline.dtype,
        "baseline_ppl": manifest.metrics.values("baseline").get("ppl"),
        "ppl": quantized.get("ppl"),
        "kld_mean": quantized.get("kld_mean"),
        "top1_agreement_pct": quantized.get("top1_agreement_pct"),
    }


def agreement(a: dict[str, float | str | None], b: dict[str, float | str | None]) -> dict[str, bool]:
    """Which of ``TOLERANCES`` hold between two sides' metrics (a missing value fails)."""

    def num(side: dict[str, float | str | None], key: str) -> float:
        value = side.get(key)
        return float(value) if isinstance(value, (int, float)) else math.nan

    def rel(key: str, tolerance: float) -> bool:
        x, y = num(a, key), num(b, key)
        return abs(x - y) <= tolerance * max(abs(x), abs(y))

    ka, kb = num(a, "kld_mean"), num(b, "kld_mean")
    kld_room = max(TOLERANCES["kld_abs"], TOLERANCES["kld_rel"] * max(ka, kb))
    return {
        "baseline_ppl": rel("baseline_ppl", TOLERANCES["baseline_ppl_rel"]),
        "ppl": rel("ppl", TOLERANCES["ppl_rel"]),
        "kld_mean": abs(ka - kb) <= kld_room,
        "top1_agreement_pct": abs(num(a, "top1_agreement_pct") - num(b, "top1_agreement_pct"))
        <= TOLERANCES["top1_points"],
    }


def parity(plan: Plan, deadline: float) -> Record:
    """Each recipe on both sides (the reference side on the CPU in float32); the metrics agree."""
    model = _tiny_model(plan)
    recipes: dict[str, Record] = {}
    slowest = 0.0
    for name in plan.recipes:
        if time.perf_counter() + 2 * slowest > deadline:
            recipes[name] = {"status": "skipped", "reason": "out of this part's time"}
            continue
        start = time.perf_counter()
        sides = {}
        for side in plan.sides:
            overrides = [*plan.sizes.parity_overrides, f"baseline.dtype={side.dtype}"]
            out = plan.work / "parity" / f"{name}-{side.device}-{side.dtype}"
            sides[side.label] = _quality(_quantize(name, overrides, model, out, side.device))
        a, b = (sides[side.label] for side in plan.sides)
        checks = agreement(a, b)
        recipes[name] = {
            "status": "ok" if all(checks.values()) else "failed",
            "sides": sides,
            "checks": checks,
        }
        slowest = max(slowest, time.perf_counter() - start)
    statuses = {record["status"] for record in recipes.values()}
    status = "failed" if "failed" in statuses else "ok" if "ok" in statuses else "skipped"
    record: Record = {"status": status, "sides": [side.label for side in plan.sides], "recipes": recipes}
    if status == "skipped":
        record["reason"] = "no recipe fitted in this part's time"
    return record


# --- gptq_large ---------------------------------------------------------------------------------


class OutOfTime(Exception):
    """GPTQ would not finish in its time (projected from the layers done so far)."""

    def __init__(self, layers_done: int, projected_s: float) -> None:
        super().__init__(f"projected {projected_s:.0f} s after {layers_done} layer(s)")
        self.layers_done = layers_done
        self.projected_s = projected_s


def build_random(shape: str, device: str, folder: Path) -> torch.nn.Module:
    """A causal LM of ``shape`` with random weights, built on ``device`` in the device's
    precision; its config and a small tokenizer are saved in ``folder`` (llm-compressor reads
    both from the model's ``name_or_path``)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from quantkit.device import compute_dtype
    from quantkit.util.testing import make_tiny_tokenizer

    config = LlamaConfig(**SHAPES[shape], bos_token_id=0, eos_token_id=0)
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    make_tiny_tokenizer(folder)  # ids below 384: every shape's vocabulary holds them
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=compute_dtype(device))
    model.config._name_or_path = str(folder)
    return model.eval()


def _layers(shape: str) -> int:
    value = SHAPES[shape]["num_hidden_layers"]
    assert isinstance(value, int)
    return value


def _peaks(device: str) -> dict[str, int | None]:
    import torch

    if device != "cuda":
        return {"peak_allocated_bytes": None, "peak_reserved_bytes": None}
    return {
        "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
        "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
    }


def _free(device: str) -> None:
    """Drop llm-compressor's hold on the last model (its session keeps it) and the GPU cache."""
    import gc

    from llmcompressor.core import active_session

    active_session().reset()
    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def gptq_on_shape(plan: Plan, shape: str, deadline: float) -> Record:
    """GPTQ W4A16 g128 (quantkit's options, llm-compressor's oneshot) on a random model of
    ``shape`` with random calibration ids; stops when its projected end passes ``deadline``."""
    import numpy as np

    from quantkit.backends.base import QuantizeJob
    from quantkit.backends.gptq import GPTQBackend, GPTQOptions
    from quantkit.backends.llmcompressor_run import oneshot_in_place
    from quantkit.inputs.tokens import TokenWindows, hash_ids

    sizes, device = plan.sizes, plan.device
    _free(device)
    before = _peaks(device)["peak_allocated_bytes"]  # what was still allocated (reset peak)
    start = time.perf_counter()
    model = build_random(shape, device, plan.work / "large" / shape)
    build_s = time.perf_counter() - start
    layers = _layers(shape)
    ids = np.random.default_rng(0).integers(1, 384, size=(sizes.large_samples, sizes.large_seq_len))
    windows = TokenWindows(ids, sizes.large_seq_len, hash_ids(ids))
    began = time.perf_counter()
    ends: list[float] = []

    def watch(index: int) -> None:
        """Layer ``index`` starts (``QuantizeJob.on_layer``), so ``index`` layers are done. Stop
        when past the deadline, or when the layers left, at the pace of those after the first
        (which also pays for caching the calibration inputs), would end past it."""
        done = index
        if done == 0:
            return
        ends.append(time.perf_counter())
        if done >= layers:
            return
        pace = (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) > 1 else ends[0] - began
        projected_end = ends[-1] + pace * (layers - done)
        if ends[-1] > deadline or (len(ends) > 1 and projected_end > deadline):
            raise OutOfTime(done, projected_end - began)

    job = QuantizeJob(
        model_path=plan.work / "large" / shape, out_dir=plan.work / "unused", device=device, seed=0
    )
    job.on_layer = watch
    record: Record = {
        "shape": shape,
        "parameters": sum(p.numel() for p in model.parameters()),
        "layers": layers,
        "samples": sizes.large_samples,
        "seq_len": sizes.large_seq_len,
        "build_s": round(build_s, 1),
        "allocated_before_bytes": before,
        "options": "W4A16 g128, actorder static, dampening 0.01, block 128 (quantkit's gptq-w4a16-g128)",
    }
    try:
        oneshot_in_place(job, model, GPTQBackend(GPTQOptions(bits=4, group_size=128)).modifier(), windows)
    except OutOfTime as stop:
        seconds = time.perf_counter() - began
        return (
            record
            | {
                "status": "out_of_time",
                "layers_done": stop.layers_done,
                "quantize_s_so_far": round(seconds, 1),
                "projected_quantize_s": round(stop.projected_s, 1),
            }
            | _peaks(device)
        )
    finally:
        del model
    seconds = time.perf_counter() - began
    result = record | {"status": "ok", "quantize_s": round(seconds, 3)} | _peaks(device)
    _free(device)
    samples_per_s = sizes.large_samples / seconds
    return result | {
        "samples_per_s": round(samples_per_s, 4),
        "vs_published_samples_per_s": round(samples_per_s / (512 / 745), 3),
    }


def gptq_large(plan: Plan, deadline: float) -> Record:
    """The 8B shape if it fits its time (or runs at all), else the 1B one (a quarter of the
    time is kept for it)."""
    attempts: list[Record] = []
    shapes = plan.sizes.large_shapes
    for index, shape in enumerate(shapes):
        reserve = 0.0 if index == len(shapes) - 1 else 0.25 * (deadline - time.perf_counter())
        try:
            attempts.append(gptq_on_shape(plan, shape, deadline - reserve))
        except Exception as err:  # e.g. out of memory: the smaller shape may still run
            attempts.append({"shape": shape, "status": "error", "error": _describe(err)})
        if attempts[-1]["status"] == "ok":
            break
    done = [attempt for attempt in attempts if attempt["status"] == "ok"]
    record: Record = {"attempts": attempts, "published": PUBLISHED}
    if not done:
        return record | {"status": "skipped", "reason": "no shape finished GPTQ in this part's time"}
    return record | {
        "status": "ok",
        "ran": done[0]["shape"],
        **{k: v for k, v in done[0].items() if k != "status"},
    }


# --- bench --------------------------------------------------------------------------------------


def _side_figures(side: object) -> Record:
    from quantkit.results.manifest import BenchSide

    assert isinstance(side, BenchSide)
    keys = (
        "runtime", "memory_kind", "load_s", "weights_memory_bytes", "peak_memory_bytes",
        "peak_allocated_bytes", "peak_reserved_bytes", "prefill_tok_s", "ttft_s", "decode_tok_s",
        "batched_decode_tok_s", "batch_size",
    )  # fmt: skip
    return {key: getattr(side, key) for key in keys}


def bench(plan: Plan, deadline: float) -> Record:
    """quantkit's pipeline with its bench stage: the random model's baseline and its FP8
    artifact, each measured in a process of its own on the GPU."""
    from quantkit.results.manifest import BenchSection

    shape = plan.sizes.bench_shape
    folder = plan.work / "bench-model" / shape
    model = build_random(shape, plan.device, folder)
    model.save_pretrained(folder)
    del model
    _free(plan.device)
    overrides = list(plan.sizes.bench_overrides)
    manifest = _quantize("fp8-dynamic", overrides, folder, plan.work / "bench-run", plan.device, bench=True)
    section = manifest.bench
    if not isinstance(section, BenchSection):
        error = getattr(section, "error", "no bench section")
        return {"status": "failed", "shape": shape, "error": str(error)}
    quantized = manifest.metrics.values("quantized")
    return {
        "status": "ok",
        "shape": shape,
        "baseline_dtype": manifest.baseline.dtype,
        "settings": section.settings,
        "baseline": _side_figures(section.baseline),
        "fp8": _side_figures(section.artifact),
        "ratios": {
            key: quantized.get(key) for key in ("decode_speed_ratio", "prefill_speed_ratio", "memory_ratio")
        },
    }


# --- gguf_offload -------------------------------------------------------------------------------


def _llama_cpp_offload() -> str | None:
    """Why llama.cpp cannot offload here (None: it can)."""
    try:
        from llama_cpp import llama_supports_gpu_offload
    except ImportError:
        return "llama-cpp-python is not installed"
    if not llama_supports_gpu_offload():
        return "the installed llama-cpp-python was built without GPU offload"
    return None


def _build_llama_cpp(plan: Plan, deadline: float) -> str | None:
    """Build llama-cpp-python with CUDA from the given sdist, time-boxed (None: built)."""
    import shutil

    if plan.sdist is None:
        return (
            "no llama-cpp-python sdist was given: its 0.3.36 sdist (76.6 MB) alone exceeds the 64 MiB "
            "a device run carries, and the GPU machine has no network to fetch it"
        )
    if plan.dry_run:
        return "the dry run has no CUDA to build llama.cpp's CUDA backend for"
    missing = [tool for tool in ("nvcc", "cmake") if shutil.which(tool) is None]
    if missing:
        return f"cannot build llama.cpp with CUDA here: {', '.join(missing)} not found"
    site = Path(os.environ.get("GPU_SITE", "/tmp/site"))  # on PYTHONPATH: importable once built
    env = os.environ | {
        "CMAKE_ARGS": "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90",
        "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 4),
    }
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-build-isolation",
    ]
    command += ["--target", str(site), str(plan.sdist)]
    timeout = deadline - time.perf_counter() - 60  # a minute left for the GGUF run itself
    if timeout < 60:
        return f"no time left to build llama.cpp with CUDA ({timeout + 60:.0f} s left)"
    try:
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"building llama-cpp-python with CUDA did not finish in {timeout:.0f} s"
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return f"building llama-cpp-python with CUDA failed: {last}"
    import importlib

    importlib.invalidate_caches()
    return None


def gguf_offload(plan: Plan, deadline: float) -> Record:
    """GGUF Q8_0 of the tiny model, benched in llama.cpp with every layer offloaded."""
    reason = _llama_cpp_offload()
    if reason is not None and reason.startswith("llama-cpp-python is not installed"):
        built = _build_llama_cpp(plan, deadline)
        if built is not None:
            return {"status": "skipped", "reason": f"{reason}; {built}"}
        reason = _llama_cpp_offload()
    if reason is not None:
        return {"status": "skipped", "reason": reason}
    from quantkit.llamacpp.convert import converter_dir

    if not (converter_dir() / "convert_hf_to_gguf.py").is_file() and not os.environ.get(
        "QUANTKIT_LLAMA_CPP_CONVERTER"
    ):
        return {
            "status": "skipped",
            "reason": "llama.cpp's HF->GGUF converter is not here (no network to fetch it)",
        }
    overrides = list(plan.sizes.bench_overrides)
    manifest = _quantize("gguf-q8_0", overrides, _tiny_model(plan), plan.work / "gguf-run", plan.device, True)
    from quantkit.results.manifest import BenchSection

    section = manifest.bench
    if not isinstance(section, BenchSection):
        return {"status": "failed", "error": str(getattr(section, "error", "no bench section"))}
    return {"status": "ok", "offloaded": True, "artifact": _side_figures(section.artifact)}


PART_FUNCTIONS: dict[str, Callable[[Plan, float], Record]] = {
    "gpu_tests": gpu_tests,
    "parity": parity,
    "gptq_large": gptq_large,
    "bench": bench,
    "gguf_offload": gguf_offload,
}


# --- the table's figures ------------------------------------------------------------------------


def _gib(value: object) -> str:
    return f"{value / 2**30:.2f} GiB" if isinstance(value, (int, float)) else "—"


def summary(name: str, part: Record) -> str:
    """One cell of figures for the table."""
    status = part.get("status")
    if status == "skipped":
        return str(part.get("reason", ""))
    if status == "error":
        return str(part.get("error", ""))
    if name == "gpu_tests":
        return f"{part.get('passed')} passed, {part.get('failed')} failed, {part.get('skipped')} skipped"
    if name == "parity":
        recipes = part.get("recipes", {})
        assert isinstance(recipes, dict)
        return ", ".join(f"{recipe}: {record['status']}" for recipe, record in recipes.items())
    if name == "gptq_large":
        attempts = part.get("attempts", [])
        first = attempts[0] if isinstance(attempts, list) and attempts else {}
        stopped = ""
        if isinstance(first, dict) and first.get("status") == "out_of_time":
            stopped = (
                f"{first.get('shape')} stopped after {first.get('layers_done')} layers "
                f"(projected {first.get('projected_quantize_s')} s); "
            )
        peaks = f"{_gib(part.get('peak_allocated_bytes'))} / {_gib(part.get('peak_reserved_bytes'))}"
        return stopped + (
            f"{part.get('ran')}: {part.get('quantize_s')} s for {part.get('samples')} x "
            f"{part.get('seq_len')} tokens, {part.get('samples_per_s')} samples/s "
            f"({part.get('vs_published_samples_per_s')}x published), peak allocated / reserved {peaks}"
        )
    if name == "bench":
        base, fp8 = part.get("baseline", {}), part.get("fp8", {})
        assert isinstance(base, dict) and isinstance(fp8, dict)
        decode = f"{base.get('decode_tok_s', 0):.1f} -> {fp8.get('decode_tok_s', 0):.1f} tok/s"
        peaks = f"{_gib(base.get('peak_allocated_bytes'))} -> {_gib(fp8.get('peak_allocated_bytes'))}"
        sides = f"{part.get('shape')} {part.get('baseline_dtype')} -> FP8"
        return f"{sides}: decode {decode}, peak allocated {peaks}"
    artifact = part.get("artifact", {})
    decode = artifact.get("decode_tok_s") if isinstance(artifact, dict) else None
    return f"GGUF Q8_0 offloaded: decode {decode} tok/s" if decode is not None else "ran"
