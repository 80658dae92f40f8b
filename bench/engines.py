"""Benchmark: quantization engines side by side on the same calibration ids and the same
evaluation: GPTQ by llm-compressor and by GPTQModel, and AutoRound.

Each run is ``quantkit quantize`` in a fresh process; within a (model, configuration) the engines
alternate, ``--repeats`` times each, on one budget (GPTQ: W4, dampening 0.01 on both engines).
Reported per engine: the quantize stage's median wall time (from the manifest), the process's
peak RSS (GNU time; it includes the evaluation), KLD, perplexity and top-1 agreement against the
shared baseline reference (one cache per model), and the calibration hash each engine was fed
(equal within a model). Written to ``bench/results/engines.json``; ``--append`` keeps the cells
of an earlier file that this run does not measure. Needs the gptqmodel extra (make test installs
it) and GNU time.

    .venv/bin/python bench/engines.py [--models smollm2-135m,gemma3-270m]
        [--configs gptq-g64,gptq-g128,autoround-g64,autoround-g128] [--repeats 3] [--append]
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

_GPTQMODEL = ["gptq-w4a16-g128-gptqmodel", "--set", "options.damp_percent=0.01"]
_AUTOROUND_LIGHT = [
    "autoround-w4a16-g128", "--set", "options.iters=50", "--set", "options.lr=0.005",
    "--set", "options.batch_size=4",
]  # fmt: skip
# configuration -> engine -> recipe arguments
CONFIGS: dict[str, dict[str, list[str]]] = {
    "gptq-g64": {
        "llmcompressor": ["gptq-w4a16-g64", "--set", "options.engine=llmcompressor"],
        "gptqmodel": [*_GPTQMODEL, "--set", "options.group_size=64"],
    },
    "gptq-g128": {
        "llmcompressor": ["gptq-w4a16-g128", "--set", "options.engine=llmcompressor"],
        "gptqmodel": _GPTQMODEL,
    },
    # AutoRound's own light preset (50 steps at lr 5e-3; its default 200 steps take ~25 min a
    # run on 2 cores), 4 of the 8 calibration samples per step
    "autoround-g64": {"autoround": [*_AUTOROUND_LIGHT, "--set", "options.group_size=64"]},
    "autoround-g128": {"autoround": _AUTOROUND_LIGHT},
}  # fmt: skip
# Group sizes must divide every linear layer's input width: SmolLM2's 576 is not a multiple of 128.
SKIP = {("smollm2-135m", "gptq-g128"), ("smollm2-135m", "autoround-g128")}


def model_argument(model: str, scratch: Path) -> str:
    """What ``--model`` gets: the embedded default by name, Gemma 3 as its joined PyPI GGUF."""
    if model == "gemma3-270m":
        from quantkit.util.testing import gemma3_gguf

        return str(gemma3_gguf(scratch / "gemma-3-270m-q4_k_m.gguf"))
    return model


def quantize(recipe: list[str], model: str, args: argparse.Namespace, out: Path) -> dict[str, object]:
    """One fresh ``quantkit quantize``; its figures."""
    budget = [
        "--set", f"calibration.num_samples={args.samples}", "--set", f"calibration.seq_len={args.seq_len}",
        "--set", f"eval.num_windows={args.windows}", "--set", f"eval.seq_len={args.eval_seq_len}",
        "--device", "cpu", "--model", model, "--out", str(out), "--format", "json", "--no-bench",
    ]  # fmt: skip
    with tempfile.NamedTemporaryFile(suffix=".txt") as report:
        start = time.perf_counter()
        command = [sys.executable, "-m", "quantkit", "quantize", *recipe, *budget]
        done = subprocess.run(
            ["/usr/bin/time", "-f", "%M", "-o", report.name, *command], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        wall = time.perf_counter() - start
        rss = int(Path(report.name).read_text().split()[-1]) * 1024
    manifest = json.loads((out / "manifest.json").read_text())
    quantized = manifest["metrics"]["quantized"]
    details = manifest["artifact"]["details"]
    return {
        "process_wall_s": round(wall, 2),
        "quantize_s": manifest["timings"]["quantize_s"],
        "peak_rss_bytes": rss,
        "kld_mean": quantized["kld_mean"]["value"],
        "ppl": quantized["ppl"]["value"],
        "top1_agreement_pct": quantized["top1_agreement_pct"]["value"],
        "baseline_ppl": manifest["metrics"]["baseline"]["ppl"]["value"],
        "disk_bytes": manifest["artifact"]["disk_bytes"],
        "calibration_fed_hash": details.get("calibration_fed_hash"),
        "reference_key": manifest["eval"]["reference_key"],
        "library_version": details.get("library_version"),
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


def measure_cell(model: str, config: str, args: argparse.Namespace, scratch: Path) -> dict[str, object]:
    """Every engine of ``config`` on ``model``, alternating, ``args.repeats`` times each."""
    engines = CONFIGS[config]
    runs: dict[str, list[dict[str, object]]] = {engine: [] for engine in engines}
    for repeat in range(args.repeats):
        order = list(engines) if repeat % 2 == 0 else list(reversed(engines))
        for engine in order:
            recipe = engines[engine]
            out = scratch / f"{model}-{config}-{engine}-{repeat}"
            result = quantize(recipe, model_argument(model, scratch), args, out)
            print(model, config, engine, json.dumps(result), file=sys.stderr, flush=True)
            runs[engine].append(result)
    cell: dict[str, object] = {
        "same_calibration_ids": len({run["calibration_fed_hash"] for r in runs.values() for run in r}) == 1,
        "same_reference": len({run["reference_key"] for r in runs.values() for run in r}) == 1,
        "engines": {engine: summary(engine_runs) for engine, engine_runs in runs.items()},
        "runs": runs,
    }
    if {"llmcompressor", "gptqmodel"} <= set(runs):
        seconds = {e: statistics.median(float(r["quantize_s"]) for r in runs[e]) for e in runs}  # type: ignore[arg-type]
        cell["quantize_s_ratio_llmcompressor_over_gptqmodel"] = round(
            seconds["llmcompressor"] / seconds["gptqmodel"], 2
        )
    return cell


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m,gemma3-270m")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--eval-seq-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--append", action="store_true", help="keep an earlier file's other cells")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "engines.json")
    args = parser.parse_args()
    results: dict[str, object] = {"cells": {}}
    if args.append and args.out.is_file():
        results = json.loads(args.out.read_text())
    cells: dict[str, object] = results["cells"]  # type: ignore[assignment]
    with tempfile.TemporaryDirectory(prefix="quantkit-engines-") as tmp:
        for model in args.models.split(","):
            scratch = Path(tmp) / model
            os.environ["QUANTKIT_CACHE"] = str(scratch / "cache")  # one baseline reference per model
            os.environ["QUANTKIT_NO_BENCH"] = "1"
            for config in args.configs.split(","):
                if (model, config) in SKIP:
                    continue
                cell = measure_cell(model, config, args, scratch)
                cell.update(
                    calibration=f"{args.samples} x {args.seq_len} tokens",
                    eval=f"{args.windows} x {args.eval_seq_len} tokens",
                    repeats=args.repeats,
                    date=time.strftime("%Y-%m-%d %H:%M"),
                    loadavg_at_end=round(os.getloadavg()[0], 2),
                )
                cells[f"{model}/{config}"] = cell
                results.update(
                    what="W4 weight-only engines on the same calibration ids and eval windows",
                    machine={"platform": platform.platform(), "cpu_count": os.cpu_count()},
                )
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    brief = {
        key: {e: {k: v for k, v in s.items() if k.startswith("median")} for e, s in cell["engines"].items()}  # type: ignore[index,union-attr]
        for key, cell in cells.items()
    }
    print(json.dumps(brief, indent=2))


if __name__ == "__main__":
    main()
