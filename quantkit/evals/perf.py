"""Speed, memory and cost of the baseline and an artifact, measured side by side.

Each model is measured in a fresh process (``perf_worker``) in its runtime, after a warm-up,
as medians of repeats. Ratios compare measurements of the same run, and only like with like:
a memory ratio needs the same kind of memory on both sides (RSS vs RSS, CUDA vs CUDA), and
cost is computed at batch 1 for every side (batched cost only where a runtime batches).
For an artifact whose runtime is not transformers (GGUF in llama.cpp), the unquantized model
is also measured in that runtime, so the speed-up is shown runtime against runtime too.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, JsonValue

from quantkit.device import BaselineDtype
from quantkit.errors import BackendError
from quantkit.inputs.specs import BenchSpec
from quantkit.results.manifest import BenchSection, BenchSide
from quantkit.util.library_log import LIBRARY_LOG


class WorkerSettings(BaseModel):
    """What one benchmark process measures (passed to ``perf_worker`` as JSON)."""

    model_config = ConfigDict(extra="forbid")

    path: str
    runtime: str
    device: str
    prompt_lengths: list[int]
    decode_tokens: int
    repeats: int
    batch_size: int
    threads: int | None
    dtype: BaselineDtype | None = None  # transformers' precision (None: the device's baseline one)


@dataclass(frozen=True)
class BenchTarget:
    """A model to measure: where it is, in which runtime, and in which precision transformers
    computes it (the run's baseline precision; other runtimes ignore it)."""

    path: Path
    runtime: str
    dtype: BaselineDtype | None = None


def _worker(settings: WorkerSettings) -> BenchSide:
    command = [sys.executable, "-m", "quantkit.evals.perf_worker", settings.model_dump_json()]
    result = subprocess.run(command, capture_output=True, text=True)
    if LIBRARY_LOG.verbose:
        sys.stderr.write(result.stderr)
    else:
        LIBRARY_LOG.write("bench worker", result.stderr.splitlines())
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise BackendError(f"benchmark of {settings.path} failed: {last}", "rerun with QUANTKIT_DEBUG=1")
    return BenchSide.model_validate_json(lines[-1])


def _settings(spec: BenchSpec, device: str, dtype: BaselineDtype | None) -> dict[str, JsonValue]:
    return {
        "device": device,
        "dtype": dtype,
        "prompt_lengths": list(spec.prompt_lengths),
        "decode_tokens": spec.decode_tokens,
        "repeats": spec.repeats,
        "batch_size": spec.batch_size,
        "threads": spec.threads,
        "price_per_hour": spec.price_per_hour,
    }


def worker_settings(target: BenchTarget, device: str, spec: BenchSpec) -> WorkerSettings:
    return WorkerSettings(
        path=str(target.path),
        runtime=target.runtime,
        device=device,
        prompt_lengths=list(spec.prompt_lengths),
        decode_tokens=spec.decode_tokens,
        repeats=spec.repeats,
        batch_size=spec.batch_size,
        threads=spec.threads,
        dtype=target.dtype,
    )


class SharedSides:
    """Bench sides measured once for a sweep and reused by each of its runs: one JSON file
    per measured model and settings, in a folder every worker sees."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, settings: WorkerSettings) -> Path:
        import hashlib

        digest = hashlib.sha256(settings.model_dump_json().encode()).hexdigest()[:16]
        return self.folder / f"bench-{digest}.json"

    def get(self, settings: WorkerSettings) -> BenchSide | None:
        try:
            return BenchSide.model_validate_json(self.path(settings).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def measure(self, settings: WorkerSettings) -> tuple[BenchSide, bool]:
        """The shared side (measured now when absent); True when it was measured now."""
        from quantkit.util.fileio import write_text_atomic

        known = self.get(settings)
        if known is not None:
            return known, False
        side = _worker(settings)
        write_text_atomic(self.path(settings), side.model_dump_json(indent=2))
        return side, True


def measure(
    baseline: BenchTarget,
    artifact: BenchTarget,
    runtime_baseline: BenchTarget | None,
    device: str,
    spec: BenchSpec,
    shared: SharedSides | None = None,
) -> BenchSection:
    """Bench the baseline (transformers), the artifact (its runtime) and, when given, the
    unquantized model in the artifact's runtime; each in its own process. With ``shared``
    (a sweep), the unquantized sides are measured once and reused by every run."""
    from quantkit.runtimes import runtime_class

    runtime_class(artifact.runtime).check_artifact(artifact.path)  # before any process starts
    reused: list[str] = []

    def unquantized(target: BenchTarget, role: str) -> BenchSide:
        settings = worker_settings(target, device, spec)
        if shared is None:
            return _worker(settings)
        side, measured = shared.measure(settings)
        if not measured:
            reused.append(role)
        return side

    base = unquantized(baseline, "baseline")
    quant = _worker(worker_settings(artifact, device, spec))
    same_runtime = None if runtime_baseline is None else unquantized(runtime_baseline, "runtime_baseline")
    return BenchSection(
        settings=_settings(spec, device, baseline.dtype),
        baseline=base,
        artifact=quant,
        runtime_baseline=same_runtime,
        shared=reused,
    )


def cost_per_mtok(price_per_hour: float, tokens_per_s: float) -> float:
    """USD for one million generated tokens at ``tokens_per_s`` on a ``price_per_hour`` device."""
    return price_per_hour / (tokens_per_s * 3600) * 1e6


def _flatten(result: BenchSide, spec: BenchSpec) -> dict[str, float]:
    metrics = {
        "prefill_tok_s": float(result.prefill_tok_s[str(max(spec.prompt_lengths))]),
        "decode_tok_s": float(result.decode_tok_s),
        "ttft_s": float(result.ttft_s[str(min(spec.prompt_lengths))]),
        "peak_memory_bytes": float(result.peak_memory_bytes),
        "weights_memory_bytes": float(result.weights_memory_bytes),
        "load_s": float(result.load_s),
    }
    if result.batched_decode_tok_s is not None:
        metrics["batched_decode_tok_s"] = float(result.batched_decode_tok_s)
    if spec.price_per_hour is not None:
        metrics["cost_per_mtok_usd"] = cost_per_mtok(spec.price_per_hour, metrics["decode_tok_s"])
        if result.batched_decode_tok_s is not None:
            metrics["batched_cost_per_mtok_usd"] = cost_per_mtok(
                spec.price_per_hour, result.batched_decode_tok_s
            )
    return metrics


def _ratios(
    quant: BenchSide, base: BenchSide, spec: BenchSpec, prefix: str
) -> tuple[dict[str, float], list[str]]:
    """Speed ratios always; memory ratios only when both sides measured the same kind of memory."""
    q, b = _flatten(quant, spec), _flatten(base, spec)
    ratios = {
        f"{prefix}decode_speed_ratio": q["decode_tok_s"] / b["decode_tok_s"],
        f"{prefix}prefill_speed_ratio": q["prefill_tok_s"] / b["prefill_tok_s"],
    }
    notes: list[str] = []
    if quant.memory_kind == base.memory_kind:
        ratios[f"{prefix}memory_ratio"] = q["peak_memory_bytes"] / max(b["peak_memory_bytes"], 1.0)
        if not prefix:
            ratios["weights_memory_ratio"] = q["weights_memory_bytes"] / max(b["weights_memory_bytes"], 1.0)
    else:
        notes.append(
            f"no {prefix}memory ratio: the artifact's memory is {quant.memory_kind} ({quant.runtime}), "
            f"the baseline's {base.memory_kind} ({base.runtime})"
        )
    return ratios, notes


def metrics_from(
    bench: BenchSection, spec: BenchSpec
) -> tuple[dict[str, float], dict[str, float], list[str]]:
    """Flat metrics for the baseline and the artifact (with its ratios), and notes on what
    could not be compared."""
    base = _flatten(bench.baseline, spec)
    quant = _flatten(bench.artifact, spec)
    ratios, notes = _ratios(bench.artifact, bench.baseline, spec, "")
    quant |= ratios
    if bench.runtime_baseline is not None:
        same_runtime, more = _ratios(bench.artifact, bench.runtime_baseline, spec, "runtime_")
        quant |= same_runtime
        notes += more
    elif bench.artifact.runtime == bench.baseline.runtime:  # the baseline already ran in it
        quant |= {
            f"runtime_{name}": value for name, value in ratios.items() if name != "weights_memory_ratio"
        }
    return base, quant, notes
