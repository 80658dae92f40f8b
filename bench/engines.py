"""Benchmark: GPTQ engines side by side (llm-compressor vs GPTQModel), same calibration ids, same
evaluation.

Each run is ``quantkit quantize`` in a fresh process, engines alternating, ``--repeats`` times
each, on the same recipe budget (W4 group 64, dampening 0.01 on both). Reported per engine: the
quantize stage's median wall time (from the manifest), the process's peak RSS (GNU time; it
includes the evaluation), KLD, perplexity and top-1 agreement against the shared baseline
reference, and the calibration hash each engine was fed (they must be equal). Written to
``bench/results/engines.json``. Needs the gptqmodel extra (make installs it).

    .venv/bin/python bench/engines.py [--model smollm2-135m] [--samples 8] [--seq-len 256] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

ENGINES = {
    "llmcompressor": ["gptq-w4a16-g64"],
    "gptqmodel": [
        "gptq-w4a16-g128-gptqmodel", "--set", "options.group_size=64", "--set", "options.damp_percent=0.01",
    ],
}  # fmt: skip


def quantize(engine: str, args: argparse.Namespace, out: Path) -> dict[str, object]:
    """One fresh ``quantkit quantize`` with ``engine``; its figures."""
    budget = [
        "--set", f"calibration.num_samples={args.samples}", "--set", f"calibration.seq_len={args.seq_len}",
        "--set", f"eval.num_windows={args.windows}", "--set", f"eval.seq_len={args.eval_seq_len}",
        "--device", "cpu", "--model", args.model, "--out", str(out), "--format", "json",
    ]  # fmt: skip
    with tempfile.NamedTemporaryFile(suffix=".txt") as report:
        start = time.perf_counter()
        command = [sys.executable, "-m", "quantkit", "quantize", *ENGINES[engine], *budget]
        subprocess.run(
            ["/usr/bin/time", "-f", "%M", "-o", report.name, *command], check=True, capture_output=True
        )
        wall = time.perf_counter() - start
        rss = int(Path(report.name).read_text().split()[-1]) * 1024
    manifest = json.loads((out / "manifest.json").read_text())
    quantized = manifest["metrics"]["quantized"]
    return {
        "process_wall_s": round(wall, 2),
        "quantize_s": manifest["timings"]["quantize_s"],
        "peak_rss_bytes": rss,
        "kld_mean": quantized["kld_mean"]["value"],
        "ppl": quantized["ppl"]["value"],
        "top1_agreement_pct": quantized["top1_agreement_pct"]["value"],
        "baseline_ppl": manifest["metrics"]["baseline"]["ppl"]["value"],
        "disk_bytes": manifest["artifact"]["disk_bytes"],
        "calibration_fed_hash": manifest["artifact"]["details"]["calibration_fed_hash"],
        "reference_key": manifest["eval"]["reference_key"],
        "library_version": manifest["artifact"]["details"]["library_version"],
    }


def summary(runs: list[dict[str, object]]) -> dict[str, object]:
    def median(key: str) -> float:
        return statistics.median(float(run[key]) for run in runs)  # type: ignore[arg-type]

    keys = ("quantize_s", "process_wall_s", "peak_rss_bytes", "kld_mean", "ppl", "top1_agreement_pct")
    out: dict[str, object] = {f"median_{key}": round(median(key), 4) for key in keys}
    seconds = [float(run["quantize_s"]) for run in runs]  # type: ignore[arg-type]
    out["quantize_s_spread"] = round(max(seconds) - min(seconds), 2)
    out["library_version"] = runs[0]["library_version"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--eval-seq-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "engines.json")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, object]]] = {engine: [] for engine in ENGINES}
    with tempfile.TemporaryDirectory(prefix="quantkit-engines-") as scratch:
        os.environ.setdefault("QUANTKIT_CACHE", str(Path(scratch) / "cache"))  # one baseline reference
        os.environ["QUANTKIT_NO_BENCH"] = "1"
        for repeat in range(args.repeats):
            order = list(ENGINES) if repeat % 2 == 0 else list(reversed(ENGINES))
            for engine in order:
                result = quantize(engine, args, Path(scratch) / f"{engine}-{repeat}")
                print(engine, json.dumps(result), file=sys.stderr)
                runs[engine].append(result)
    fed = {run["calibration_fed_hash"] for engine_runs in runs.values() for run in engine_runs}
    references = {run["reference_key"] for engine_runs in runs.values() for run in engine_runs}
    engines = {engine: summary(engine_runs) for engine, engine_runs in runs.items()}
    llmc, gm = engines["llmcompressor"], engines["gptqmodel"]
    results = {
        "what": "GPTQ W4 g64 on the same calibration ids and eval windows: llm-compressor vs GPTQModel",
        "model": args.model,
        "calibration": f"{args.samples} x {args.seq_len} tokens",
        "eval": f"{args.windows} x {args.eval_seq_len} tokens",
        "repeats": args.repeats,
        "same_calibration_ids": len(fed) == 1,
        "same_reference": len(references) == 1,
        "engines": engines,
        "quantize_s_ratio_gptqmodel_over_llmcompressor": round(
            float(gm["median_quantize_s"]) / float(llmc["median_quantize_s"]),  # type: ignore[arg-type]
            3,
        ),
        "runs": runs,
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
        "date": time.strftime("%Y-%m-%d"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in results.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
