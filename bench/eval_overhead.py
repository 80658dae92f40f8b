"""Benchmark: quantkit's evaluation (ppl + KLD + top-1 against the cached reference) vs one
bare forward pass over the same token windows, in the same process, alternating.

Target: at most 1.15x. Written to ``bench/results/eval_overhead.json``.

    .venv/bin/python bench/eval_overhead.py [--model smollm2-135m] [--windows 8] [--seq-len 512]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--top-k", type=int, default=32)
    parser.add_argument("--tail-samples", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "eval_overhead.json")
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer

    from quantkit.evals import reference as ref
    from quantkit.evals.quality import score, summarize
    from quantkit.inputs.calibration import eval_windows
    from quantkit.inputs.models import resolve_model
    from quantkit.inputs.specs import EvalSpec
    from quantkit.runtimes.base import RuntimeSettings
    from quantkit.runtimes.hf import HFRuntime
    from quantkit.util.environment import library_versions
    from quantkit.util.progress import quiet_libraries

    quiet_libraries(False)
    source = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(source.path)
    windows = eval_windows(EvalSpec(num_windows=args.windows, seq_len=args.seq_len), tokenizer)
    runtime = HFRuntime.load(source.path, RuntimeSettings(device="cpu", context_length=args.seq_len))
    shape = ref.ReferenceShape(args.top_k, args.batch_size, args.tail_samples)
    reference = ref.compute(runtime, windows, shape, "bench")
    ids = torch.as_tensor(windows.ids)

    def bare() -> None:
        with torch.inference_mode():
            for start in range(0, len(ids), args.batch_size):
                runtime.model(input_ids=ids[start : start + args.batch_size]).logits  # noqa: B018

    def quantkit_eval() -> None:
        summarize(score(runtime, windows, reference, args.batch_size), 1.0)

    bare()  # warm-up
    times: dict[str, list[float]] = {"bare_forward": [], "quantkit_eval": []}
    for _ in range(args.repeats):
        for name, fn in (("bare_forward", bare), ("quantkit_eval", quantkit_eval)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
            print(f"{name:14s} {times[name][-1]:.2f} s")
    bare_s = statistics.median(times["bare_forward"])
    eval_s = statistics.median(times["quantkit_eval"])
    figures = {
        "benchmark": "eval_overhead",
        "model": args.model,
        "windows": args.windows,
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "top_k": args.top_k,
        "tail_samples": args.tail_samples,
        "repeats": args.repeats,
        "bare_forward_s": bare_s,
        "quantkit_eval_s": eval_s,
        "ratio": eval_s / bare_s,
        "target": 1.15,
        "raw": times,
        "torch_threads": torch.get_num_threads(),
        "libraries": library_versions(),
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"ratio {figures['ratio']:.3f} (target <= 1.15) -> {args.out}")


if __name__ == "__main__":
    main()
