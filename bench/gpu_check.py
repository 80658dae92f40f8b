"""One short check of quantkit on a CUDA GPU (issue #16): ``make gpu-check``.

On the GPU machine (Python 3.12, torch with CUDA, transformers, accelerate, no network), from
the repository root, with the wheels of ``make gpu-wheels`` carried in ``.whl/``:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && \\
        python3 bench/gpu_check.py --out $OUT

Parts, each time-boxed within ``--budget-s`` (540 s: the whole check within ~9 minutes), each
one's failure recorded without stopping the others, a part skipped with its reason when the
time left is too short:

- ``gpu_tests``: the ``gpu``-marked tests (tests/cli/test_cuda.py);
- ``parity``: the same recipes (FP8 dynamic, GPTQ W4, AWQ W4, RTN) on a tiny random Llama on
  the CPU (float32) and on CUDA (bfloat16): metrics agree within ``TOLERANCES``;
- ``gptq_large``: llm-compressor's GPTQ W4A16 g128 on a Llama-3-8B-shaped model with random
  weights built on the GPU from a config, 128 x 2048 random calibration tokens: wall time, peak
  VRAM and samples/s against llm-compressor's published 745 s for 512 samples; a 1B shape when
  the 8B one would not finish in its time;
- ``bench``: quantkit's bench of a Llama-3.2-1B-shaped random model (bfloat16 baseline) and its
  FP8-dynamic artifact on CUDA: peak allocated/reserved memory, prefill/decode tok/s, TTFT;
- ``gguf_offload``: a GGUF artifact benched in llama.cpp with every layer offloaded, where
  llama-cpp-python has GPU offload (or builds with CUDA from an sdist in the time left).

Speed and memory need no trained weights: the large models are random (the output says so).
Writes ``gpu_check.json`` and ``gpu_check.md`` under ``--out``. Exit 0 when no part failed, 1
when one failed or errored, 2 when it cannot run: without CUDA it says why in one line.
``--dry-run-cpu`` runs every part it can on the CPU at tiny sizes (the CUDA side becomes a
bfloat16 baseline on the CPU, the 8B shape a tiny one), so its code paths run in ``make test``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import gpu_parts  # noqa: E402  (the bench folder, not a package)

SCHEMA = 1
DEFAULT_BUDGET_S = 540.0
PARTS = ("gpu_tests", "parity", "gptq_large", "bench", "gguf_offload")
INSTALL = (
    "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "
    "--target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD"
)


def cuda_problem() -> str | None:
    """Why this machine cannot run the check on CUDA (None: it can). Imports torch only."""
    try:
        import torch
    except ImportError as err:
        return f"torch is not importable ({err})"
    if not torch.cuda.is_available():
        return f"no CUDA device is visible to torch {torch.__version__} (torch.cuda.is_available() is False)"
    return None


def dependency_problem() -> str | None:
    """The first of quantkit's dependencies that is missing here (None: all import)."""
    import importlib

    for module in (
        "pydantic",
        "yaml",
        "typer",
        "rich",
        "transformers",
        "llmcompressor",
        "compressed_tensors",
    ):
        try:
            importlib.import_module(module)
        except ImportError as err:
            return f"{module} is not importable ({err}); install the carried wheels first: {INSTALL}"
    return None


def table(report: dict[str, object]) -> str:
    """The short Markdown table of the parts."""
    parts = report["parts"]
    assert isinstance(parts, dict)
    lines = [
        f"# quantkit GPU check ({report['mode']}, {report['machine_summary']})",
        "",
        str(report["note"]),
        "",
        "| part | status | seconds | figures |",
        "|---|---|---:|---|",
    ]
    for name in PARTS:
        part = parts[name]
        seconds = part.get("seconds")
        shown = "—" if seconds is None else f"{seconds:.1f}"
        lines.append(f"| {name} | {part['status']} | {shown} | {gpu_parts.summary(name, part)} |")
    lines += ["", f"total {report['elapsed_s']:.1f} s of a {report['budget_s']:.0f} s budget", ""]
    machine = report["machine"]
    conflicts = machine.get("requirement_conflicts") if isinstance(machine, dict) else None
    if conflicts:
        lines += [f"requirement conflicts (carried wheels vs this machine): {'; '.join(conflicts)}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".gpu-check")))
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="the whole check's time")
    parser.add_argument("--dry-run-cpu", action="store_true", help="every part on the CPU at tiny sizes")
    parser.add_argument(
        "--preflight", action="store_true", help="only check that CUDA is here (exit 2 if not)"
    )
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}"
    )
    parser.add_argument("--parity-recipes", default=",".join(gpu_parts.PARITY_RECIPES))
    parser.add_argument("--llama-cpp-sdist", type=Path, default=None, help="build llama-cpp-python from it")
    args = parser.parse_args(argv)
    chosen = [name for name in args.parts.split(",") if name]
    unknown = sorted(set(chosen) - set(PARTS))
    if unknown:
        print(
            f"gpu_check: unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}",
            file=sys.stderr,
        )
        return 2
    problem = None if args.dry_run_cpu else cuda_problem()
    if problem is not None:
        print(
            f"gpu_check: cannot run: {problem}; it needs a CUDA machine (--dry-run-cpu: CPU parts)",
            file=sys.stderr,
        )
        return 2
    if args.preflight:
        return 0
    problem = dependency_problem()
    if problem is not None:
        print(f"gpu_check: cannot run: {problem}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="quantkit-gpu-check-") as work:
        gpu_parts.isolate(Path(work))
        plan = gpu_parts.make_plan(
            dry_run=args.dry_run_cpu,
            work=Path(work),
            recipes=[name for name in args.parity_recipes.split(",") if name],
            sdist=args.llama_cpp_sdist,
        )
        clock = gpu_parts.Clock(start, args.budget_s)
        parts = {
            name: gpu_parts.run_part(name, plan, clock) if name in chosen else gpu_parts.not_chosen()
            for name in PARTS
        }
    report: dict[str, object] = {
        "schema_version": SCHEMA,
        "mode": "dry-run-cpu" if args.dry_run_cpu else "cuda",
        "created": gpu_parts.now(),
        "note": gpu_parts.NOTE,
        "machine": gpu_parts.machine(plan.device),
        "machine_summary": gpu_parts.machine_summary(plan.device),
        "budget_s": args.budget_s,
        "elapsed_s": round(time.perf_counter() - start, 1),
        "tolerances": gpu_parts.TOLERANCES,
        "parts": parts,
    }
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    markdown = table(report)
    (args.out / "gpu_check.md").write_text(markdown, encoding="utf-8")
    print(markdown)
    failed = [name for name, part in parts.items() if part["status"] in ("failed", "error")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
