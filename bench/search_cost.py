"""Benchmark: what `quantkit search` costs and what it finds on SmolLM2-135M (issue #17).

1. One recipe run: `quantkit quantize gguf-q4_k_m` on the search windows (the cost unit, and the
   budget: its KLD).
2. `quantkit sensitivity` (measured + proxy): the profile's cost in forward passes and the
   Spearman rank correlation of the proxy against the measured KLD increases.
3. `quantkit search --max-kld <Q4_K_M's KLD>` (proxy profile): wall time as a multiple of (1);
   goal <= 6x.
4. The issue's target on held-out windows the search never saw (`eval.first_window` past the
   search windows): the searched artifact and plain Q4_K_M, each evaluated there; and the point
   of the same demotion path at Q4_K_M's size (target: >= 10 % fewer bits per weight at no more
   KLD, or >= 20 % lower KLD at Q4_K_M's size).

Written to ``bench/results/search_cost.json``.

    .venv/bin/python bench/search_cost.py [--candidates 6] [--skip-measured]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEARCH = ["--set", "eval.num_windows=8", "--set", "eval.seq_len=256", "--device", "cpu"]
HELD_OUT = ["--set", "eval.first_window=8", "--set", "eval.num_windows=16", "--set", "eval.seq_len=256"]


def quantkit(args: list[str], ok: tuple[int, ...] = (0,)) -> tuple[float, str]:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "quantkit", *args], capture_output=True, text=True)
    if result.returncode not in ok:
        raise SystemExit(f"quantkit {' '.join(args[:2])} failed:\n{result.stderr[-3000:]}")
    return time.perf_counter() - start, result.stdout


def run(recipe: str, out: Path, extra: list[str]) -> tuple[float, dict]:
    seconds, _ = quantkit(
        ["quantize", recipe, "--out", str(out), "--no-bench", "--device", "cpu", *extra], (0, 1)
    )
    manifest = json.loads((out / "manifest.json").read_text())
    quantized = manifest["metrics"]["quantized"]
    return seconds, {
        "kld": quantized["kld_mean"]["value"],
        "ppl_increase_pct": quantized["ppl_increase_pct"]["value"],
        "bpw": manifest["artifact"]["details"]["bits_per_weight"],
        "eval": manifest["recipe"]["eval"] | {"tokens_hash": manifest["eval"].get("tokens_hash")},
    }


def at_size(search: Path, bpw: float, folder: Path) -> Path:
    """The recipe of the demotion path's point with at most ``bpw`` (the search's own path)."""
    from quantkit.inputs.recipe import load_recipe, validate_recipe
    from quantkit.search.driver import SearchRecord, load_profile
    from quantkit.search.mix import build_path, calibrated, mix_options

    record = SearchRecord.model_validate_json((search / "search.json").read_text())
    profile = load_profile(search / "sensitivity.json")
    path = build_path(profile, calibrated(profile), record.seed)
    index = next(i for i in range(len(path.steps) + 1) if path.bpw(i) <= bpw)
    data = load_recipe(search / "chosen-recipe.yaml").model_dump(mode="json")
    data |= {"name": "search-at-q4km-size", "options": mix_options(path.mix(index), profile.base)}
    chosen = validate_recipe(data)
    target = folder / "at-size.yaml"
    target.write_text(chosen.to_yaml())
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--candidates", type=int, default=6)
    parser.add_argument("--skip-measured", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="search-cost-"))
    figures: dict[str, object] = {"machine": f"{platform.node()} ({os.cpu_count()} cores)", "work": str(work)}

    recipe_s, q4km = run("gguf-q4_k_m", work / "q4km", SEARCH)
    figures["one_recipe_run"] = {"recipe": "gguf-q4_k_m", "seconds": round(recipe_s, 1), **q4km}
    print("Q4_K_M on the search windows:", figures["one_recipe_run"], flush=True)

    if not args.skip_measured:
        seconds, _ = quantkit(["sensitivity", "--out", str(work / "profile"), *SEARCH, "--format", "json"])
        profile = json.loads((work / "profile" / "sensitivity.json").read_text())
        figures["sensitivity"] = {
            "seconds": round(seconds, 1),
            "x_recipe_run": round(seconds / recipe_s, 2),
            "cost": profile["cost"],
            "spearman": profile["spearman"],
            "base_kld": profile["base_kld"],
            "units": [{k: u[k] for k in ("unit", "kind", "proxy", "kld_increase")} for u in profile["units"]],
        }
        print("sensitivity:", {k: v for k, v in figures["sensitivity"].items() if k != "units"}, flush=True)

    search = work / "search"
    seconds, _ = quantkit(
        ["search", "--max-kld", f"{q4km['kld']:.6g}", "--max-candidates", str(args.candidates),
         "--out", str(search), *SEARCH, "--format", "json"],
        (0, 1),
    )  # fmt: skip
    record = json.loads((search / "search.json").read_text())
    figures["search"] = {
        "seconds": round(seconds, 1),
        "x_recipe_run": round(seconds / recipe_s, 2),
        "goal_x": 6,
        "budget_kld": q4km["kld"],
        "candidates": record["candidates"],
        "chosen": record["chosen"],
        "why": record["why"],
        "record_seconds": record["seconds"],
    }
    print("search:", figures["search"]["seconds"], "s", record["why"], flush=True)

    if record["chosen"]:
        _, plain = run("gguf-q4_k_m", work / "q4km-held-out", HELD_OUT)
        _, searched = run(str(search / "chosen-recipe.yaml"), work / "searched-held-out", HELD_OUT)
        _, same_size = run(str(at_size(search, q4km["bpw"], work)), work / "at-size-held-out", HELD_OUT)
        figures["held_out"] = {
            "windows": "eval windows 8..23 of 256 tokens (the search used 0..7)",
            "q4_k_m": plain,
            "searched": searched,
            "path_at_q4_k_m_size": same_size,
            "bpw_reduction_pct": round(100 * (1 - searched["bpw"] / plain["bpw"]), 2),
            "kld_change_pct": round(100 * (searched["kld"] / plain["kld"] - 1), 2),
            "kld_change_at_size_pct": round(100 * (same_size["kld"] / plain["kld"] - 1), 2),
            "target": ">= 10 % fewer bpw at no more KLD, or >= 20 % lower KLD at Q4_K_M's size",
        }
        print("held out:", figures["held_out"], flush=True)
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "search_cost.json").write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
