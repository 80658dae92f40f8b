"""Benchmark: quantkit's GPTQ stage vs a bare llm-compressor script, same model and settings.

Both sides run in fresh subprocesses, alternately, ``--repeats`` times each: load the model,
run ``oneshot`` with the same GPTQModifier on the same calibration token ids, save the
compressed checkpoint. Reported: median wall time and peak RSS of each side and their
ratios (quantkit / bare), and each side's spread (max - min). Target: wall ratio <= 1.05.
Written to ``bench/results/gptq_overhead.json``.

    .venv/bin/python bench/gptq_overhead.py [--model smollm2-135m] [--samples 16] [--seq-len 256]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

BARE = r"""
import sys, numpy as np, torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from llmcompressor import oneshot
from llmcompressor.modifiers.gptq import GPTQModifier
model_path, ids_path, out, group = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ids = np.load(ids_path)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
tokenizer = AutoTokenizer.from_pretrained(model_path)
data = Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": np.ones_like(ids).tolist()})
modifier = GPTQModifier(
    config_groups={"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int",
        "symmetric": True, "strategy": "group", "group_size": group, "actorder": "static"}}},
    ignore=["lm_head"], dampening_frac=0.01, block_size=128)
oneshot(model=model, recipe=modifier, dataset=data, num_calibration_samples=len(ids),
        max_seq_length=ids.shape[1], shuffle_calibration_samples=False)
model.save_pretrained(out, save_compressed=True)
tokenizer.save_pretrained(out)
"""

QUANTKIT = r"""
import sys, numpy as np
from pathlib import Path
from quantkit.backends.base import QuantizeJob
from quantkit.backends.gptq import GPTQBackend, GPTQOptions
from quantkit.inputs.tokens import TokenWindows, hash_ids
from quantkit.util.progress import quiet_libraries
model_path, ids_path, out, group = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ids = np.load(ids_path)
quiet_libraries(False)
job = QuantizeJob(model_path=Path(model_path), out_dir=Path(out), device="cpu", seed=0,
                  calibration=TokenWindows(ids, ids.shape[1], hash_ids(ids)))
GPTQBackend(GPTQOptions(bits=4, group_size=group)).quantize(job)
"""


def run_measured(code: str, args: list[str]) -> tuple[float, int]:
    """Like run(), but peak RSS read from GNU time so each child is measured on its own."""
    with tempfile.NamedTemporaryFile(suffix=".txt") as report:
        start = time.perf_counter()
        subprocess.run(
            ["/usr/bin/time", "-f", "%M", "-o", report.name, sys.executable, "-c", code, *args],
            check=True,
            capture_output=True,
        )
        wall = time.perf_counter() - start
        return wall, int(Path(report.name).read_text().split()[-1]) * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "gptq_overhead.json")
    args = parser.parse_args()

    import numpy as np
    from transformers import AutoTokenizer

    from quantkit.inputs.calibration import calibration_windows
    from quantkit.inputs.models import resolve_model
    from quantkit.inputs.specs import CalibrationSpec
    from quantkit.util.environment import library_versions

    source = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(source.path)
    windows = calibration_windows(CalibrationSpec(num_samples=args.samples, seq_len=args.seq_len), tokenizer)
    results: dict[str, list[tuple[float, int]]] = {"bare": [], "quantkit": []}
    with tempfile.TemporaryDirectory() as tmp:
        ids_path = Path(tmp) / "ids.npy"
        np.save(ids_path, windows.ids)
        for repeat in range(args.repeats):
            for side, code in (("bare", BARE), ("quantkit", QUANTKIT)):  # alternate: same machine load
                out = Path(tmp) / f"{side}-{repeat}"
                results[side].append(
                    run_measured(code, [str(source.path), str(ids_path), str(out), str(args.group_size)])
                )
                wall, peak = results[side][-1]
                print(f"{side:9s} repeat {repeat}: {wall:.1f} s, {peak / 2**20:.0f} MiB")

    def median(side: str, index: int) -> float:
        return statistics.median(value[index] for value in results[side])

    figures = {
        "benchmark": "gptq_overhead",
        "model": args.model,
        "calibration": {"samples": args.samples, "seq_len": args.seq_len, "hash": windows.hash},
        "group_size": args.group_size,
        "repeats": args.repeats,
        "bare": {"wall_s": median("bare", 0), "peak_rss_bytes": median("bare", 1)},
        "quantkit": {"wall_s": median("quantkit", 0), "peak_rss_bytes": median("quantkit", 1)},
        "ratio_wall": median("quantkit", 0) / median("bare", 0),
        # max - min wall time per side: the ratio means something only when the gap between the
        # medians is larger than this spread
        "spread_wall_s": {
            side: max(v[0] for v in runs) - min(v[0] for v in runs) for side, runs in results.items()
        },
        "ratio_peak_rss": median("quantkit", 1) / median("bare", 1),
        "raw": results,
        "libraries": library_versions(),
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    ratios = f"wall ratio {figures['ratio_wall']:.3f}, peak RSS ratio {figures['ratio_peak_rss']:.3f}"
    print(f"{ratios} -> {args.out}")


if __name__ == "__main__":
    main()
