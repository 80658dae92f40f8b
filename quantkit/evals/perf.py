"""Speed, memory and cost of the baseline and an artifact, measured side by side.

Each model is measured in a fresh process (``perf_worker``) in its own runtime, after a
warm-up, as medians of repeats. Ratios compare the two measurements of the same run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantkit.errors import BackendError

if TYPE_CHECKING:
    from quantkit.bench_spec import BenchSpec

# Documented reference prices (USD per device-hour, on-demand list prices seen in late 2026;
# pass your own with bench.price_per_hour or --price-per-hour).
REFERENCE_PRICES = {
    "cpu-2core": 0.10,
    "l4": 0.80,
    "a10g": 1.20,
    "l40s": 1.90,
    "a100-80gb": 3.00,
    "h100-80gb": 4.50,
    "h200": 5.50,
}


def _worker(settings: dict[str, Any]) -> dict[str, Any]:
    command = [sys.executable, "-m", "quantkit.evals.perf_worker", json.dumps(settings)]
    result = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise BackendError(f"benchmark of {settings['path']} failed: {last}", "rerun with QUANTKIT_DEBUG=1")
    data: dict[str, Any] = json.loads(lines[-1])
    return data


def measure_pair(
    baseline: Path, artifact: Path, artifact_runtime: str, device: str, spec: BenchSpec
) -> dict[str, Any]:
    """Bench the baseline (transformers) and the artifact (its own runtime)."""
    if artifact_runtime == "llamacpp":
        from quantkit.runtimes.llamacpp import check_gguf, gguf_file

        check_gguf(gguf_file(artifact))  # a damaged file is the user's to fix, before any process starts
    common = {
        "device": device,
        "prompt_lengths": spec.prompt_lengths,
        "decode_tokens": spec.decode_tokens,
        "repeats": spec.repeats,
        "batch_size": spec.batch_size,
        "threads": spec.threads,
    }
    base = _worker({"path": str(baseline), "runtime": "hf", **common})
    quant = _worker({"path": str(artifact), "runtime": artifact_runtime, **common})
    return {
        "schema_version": 1,
        "settings": common | {"price_per_hour": spec.price_per_hour},
        "baseline": base,
        "artifact": quant,
    }


def _flatten(result: dict[str, Any], spec: BenchSpec) -> dict[str, float]:
    longest = str(max(spec.prompt_lengths))
    shortest = str(min(spec.prompt_lengths))
    metrics = {
        "prefill_tok_s": float(result["prefill_tok_s"][longest]),
        "decode_tok_s": float(result["decode_tok_s"]),
        "ttft_s": float(result["ttft_s"][shortest]),
        "peak_memory_bytes": float(result["peak_memory_bytes"]),
        "weights_memory_bytes": float(result["weights_memory_bytes"]),
        "load_s": float(result["load_s"]),
    }
    if "batched_decode_tok_s" in result:
        metrics["batched_decode_tok_s"] = float(result["batched_decode_tok_s"])
    if spec.price_per_hour is not None:
        throughput = max(metrics.get("batched_decode_tok_s", 0.0), metrics["decode_tok_s"])
        metrics["cost_per_mtok_usd"] = spec.price_per_hour / (throughput * 3600) * 1e6
    return metrics


def metrics_from(bench: dict[str, Any], spec: BenchSpec) -> tuple[dict[str, float], dict[str, float]]:
    """Flat metrics for the baseline and the artifact, with the artifact's ratios to baseline."""
    base = _flatten(bench["baseline"], spec)
    quant = _flatten(bench["artifact"], spec)
    quant["decode_speed_ratio"] = quant["decode_tok_s"] / base["decode_tok_s"]
    quant["prefill_speed_ratio"] = quant["prefill_tok_s"] / base["prefill_tok_s"]
    quant["memory_ratio"] = quant["peak_memory_bytes"] / max(base["peak_memory_bytes"], 1.0)
    quant["weights_memory_ratio"] = quant["weights_memory_bytes"] / max(base["weights_memory_bytes"], 1.0)
    return base, quant
