"""Benchmark: what a sweep saves and what Ray costs, measured side by side in one run.

1. A 4-recipe ``quantkit sweep`` against 4 separate ``quantkit quantize`` calls (same recipes,
   model, budgets, bench settings): wall time, and the baseline work each did (references
   computed, baseline bench processes run). Target: the sweep is faster by at least the
   baseline work it saves.
2. The same sweep through the local executor and through Ray on this machine
   (``ray: {address: local, num_cpus: all cores}``: one run at a time, like the local one), so
   the difference is Ray's overhead: its start, task dispatch, worker process imports.
   Target: under 5 % of a run on SmolLM2.

Each mode starts from the same cache with the baseline reference removed (so every mode pays
for it once); the converted model stays cached. Written to ``bench/results/sweep_overhead.json``.

    .venv/bin/python bench/sweep_overhead.py [--windows 8] [--seq-len 256]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECIPES = ["fp8-dynamic", "rtn-w4a16-g64", "gguf-q8_0", "gguf-q4_k_m"]


def _quantkit(args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "quantkit", *args], capture_output=True, text=True, env=env
    )
    if result.returncode != 0:
        raise SystemExit(f"quantkit {' '.join(args[:2])} failed:\n{result.stderr[-3000:]}")
    return time.perf_counter() - start


def _fresh_baseline(cache: Path) -> None:
    for name in ("references", "lm_eval"):
        shutil.rmtree(cache / name, ignore_errors=True)


def _ray_overhead(local: dict, ray: dict, wall_difference_s: float) -> dict[str, float]:
    """Ray's cost against the local executor, split into where it goes."""
    local_runs = [run["seconds"] for run in local["runs"]]
    ray_runs = [run["seconds"] for run in ray["runs"]]
    mean_run = sum(local_runs) / len(local_runs)
    # outside the task body: scheduling, argument/result transfer, ray.wait
    dispatch = (ray["timings"]["runs_s"] - sum(ray_runs)) / len(ray_runs)
    # inside: the first task pays the worker process's imports (torch, transformers) that the
    # local executor paid once in the driver before its first run
    first_extra = ray_runs[0] - local_runs[0]
    later_extra = (sum(ray_runs[1:]) - sum(local_runs[1:])) / max(1, len(ray_runs) - 1)
    total = (ray["timings"]["runs_s"] - local["timings"]["runs_s"]) / len(ray_runs)
    return {
        "mean_local_run_s": round(mean_run, 2),
        "overhead_per_run_pct": round(100 * total / mean_run, 2),
        "dispatch_s_per_run": round(dispatch, 3),
        "dispatch_pct_of_run": round(100 * dispatch / mean_run, 2),
        "first_task_extra_s": round(first_extra, 2),
        "later_tasks_extra_s_per_run": round(later_extra, 2),
        "wall_difference_s": round(wall_difference_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "sweep_overhead.json")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="quantkit-sweep-bench-"))
    cache = Path(os.environ.get("QUANTKIT_CACHE", Path.home() / ".cache" / "quantkit"))
    env = {**os.environ, "QUANTKIT_CACHE": str(cache), "QUANTKIT_RUNS_DIR": str(work / "runs")}
    env.pop("QUANTKIT_NO_BENCH", None)
    budget = [
        f"eval.num_windows={args.windows}", f"eval.seq_len={args.seq_len}",
        "calibration.num_samples=8", f"calibration.seq_len={args.seq_len}",
        "bench.prompt_lengths=[64]", "bench.decode_tokens=16", "bench.repeats=2", "bench.batch_size=1",
    ]  # fmt: skip
    sets = [flag for item in budget for flag in ("--set", item)]
    common = [*sets, "--device", "cpu", "--bench"]
    _quantkit(["recipes", "list"], env)  # warm the imports' file cache

    # 1. separate quantize calls
    _fresh_baseline(cache)
    separate: list[float] = []
    for recipe in RECIPES:
        separate.append(
            _quantkit(["quantize", recipe, *common, "--out", str(work / "separate" / recipe)], env)
        )
    separate_runs = [json.loads((work / "separate" / r / "manifest.json").read_text()) for r in RECIPES]

    # 2. one sweep, local executor
    _fresh_baseline(cache)
    sweep_s = _quantkit(["sweep", *RECIPES, *common, "--out", str(work / "sweep")], env)
    sweep = json.loads((work / "sweep" / "sweep.json").read_text())

    # 3. the same sweep on Ray, on this machine, one run at a time
    _fresh_baseline(cache)
    spec = work / "ray.yaml"
    cores = os.cpu_count() or 1
    spec.write_text(
        json.dumps({"name": "ray", "recipes": RECIPES, "ray": {"address": "local", "num_cpus": cores}}),
        encoding="utf-8",
    )
    # a token of its own: a new local cluster would otherwise write one to ~/.ray/auth_token
    ray_env = {**env, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    ray_s = _quantkit(["sweep", str(spec), *common, "--ray", "local", "--out", str(work / "ray")], ray_env)
    ray = json.loads((work / "ray" / "sweep.json").read_text())

    baseline_bench_separate = len(RECIPES)  # every quantize call benchmarks the baseline itself
    references_separate = sum(not run["eval"]["reference_cached"] for run in separate_runs)
    baseline_bench_s = sum(b["bench_s"] or 0.0 for b in sweep["baselines"])  # one baseline bench process
    per_run_local = [run["seconds"] for run in sweep["runs"]]
    per_run_ray = [run["seconds"] for run in ray["runs"]]
    figures = {
        "benchmark": "sweep_overhead",
        "model": "smollm2-135m",
        "recipes": RECIPES,
        "budget": budget,
        "machine": {"cpu_count": cores, "platform": platform.platform()},
        "separate_quantize_calls": {
            "wall_s": round(sum(separate), 1),
            "per_call_s": [round(s, 1) for s in separate],
            "references_computed": references_separate,
            "baseline_bench_processes": baseline_bench_separate,
        },
        "sweep_local": {
            "wall_s": round(sweep_s, 1),
            "baseline_phase_s": sweep["timings"]["baseline_s"],
            "outside_phases_s": round(
                sweep_s - sweep["timings"]["baseline_s"] - sweep["timings"]["runs_s"], 1
            ),
            "references_computed": sum(b["reference_computed"] for b in sweep["baselines"]),
            "baseline_bench_processes": sum(b["bench_sides_measured"] for b in sweep["baselines"]),
            "per_run_s": per_run_local,
        },
        "sweep_ray_local": {
            "wall_s": round(ray_s, 1),
            "per_run_s": per_run_ray,
            "runs_s": ray["timings"]["runs_s"],
            # on a Ray worker: its process's imports are paid here, not by the first run
            "baseline_phase_s": ray["timings"]["baseline_s"],
            # process start, Ray's local cluster start and connection, report
            "outside_phases_s": round(ray_s - ray["timings"]["baseline_s"] - ray["timings"]["runs_s"], 1),
        },
        "sweep_vs_separate_speedup": round(sum(separate) / sweep_s, 3),
        "saved_s": round(sum(separate) - sweep_s, 1),
        # the baseline work the separate calls repeat: 3 more baseline bench processes
        "baseline_bench_s": baseline_bench_s,
        "baseline_work_saved_s": round((len(RECIPES) - 1) * baseline_bench_s, 1),
        "ray": _ray_overhead(sweep, ray, ray_s - sweep_s),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(figures, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
