"""Benchmark: a quantize run's peak RSS vs the bare library's fp32 load and one forward pass.

For each shape (a random-weight 1.17B Llama with SmolLM2's tokenizer, built once and cached,
and SmolLM2-135M itself), two sides run in fresh subprocesses, alternately, ``--repeats``
times each:

- bare: transformers' fp32 ``AutoModelForCausalLM.from_pretrained`` and one forward pass over
  the eval windows quantkit would use (same ids, same batch size);
- quantkit: ``quantkit quantize fp8-dynamic --model FOLDER --set eval.num_windows=4 --set
  eval.seq_len=256 --no-bench --allow-implausible-baseline`` (random weights fail the
  baseline guard) with an empty ``QUANTKIT_CACHE`` (the baseline reference is computed in the
  run, as on a first run).

Peak RSS per child from GNU time (``%M``), or from ``getrusage(RUSAGE_CHILDREN)`` in a wrapper
process of its own where GNU time is missing. Target: quantkit / bare <= 1.10 on the 1.17B
shape (issue #35, item 9: one model in memory at a time; SmolLM2's ratio is reported, its
~0.3 GB of scoring temporaries weigh more beside a 135M model). Written to
``bench/results/memory.json``.

    .venv/bin/python bench/memory.py [--shapes llama-1.17b,smollm2-135m] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET = 1.10
RECIPE = "fp8-dynamic"
OVERRIDES = ["eval.num_windows=4", "eval.seq_len=256"]

# hidden 2048, intermediate 5632, 22 layers, 32 heads, 4 KV heads, vocab 49152, untied head:
# 1.17B parameters (TinyLlama's shape with SmolLM2's vocabulary)
LLAMA_1B = {
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "vocab_size": 49152,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)

BARE = r"""
import sys, numpy as np, torch
from transformers import AutoModelForCausalLM
path, ids_path, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
ids = torch.as_tensor(np.load(ids_path), dtype=torch.long)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
model.eval()
with torch.inference_mode():
    for start in range(0, len(ids), batch):
        model(input_ids=ids[start : start + batch]).logits.cpu()
"""

# where GNU time is missing: run the command as this wrapper's only child, print its peak (KiB)
# and exit with its status
WRAPPER = r"""
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(code)
"""


def build_llama(folder: Path, tokenizer_from: Path, dtype: str) -> Path:
    """The random-weight 1.17B Llama (seed 0, safetensors in ``dtype``) with SmolLM2's
    tokenizer files, made once into ``folder``."""
    done = folder / ".complete"
    if done.is_file():
        return folder
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    shutil.rmtree(folder, ignore_errors=True)
    torch.manual_seed(0)
    config = LlamaConfig(**LLAMA_1B, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(folder)
    del model
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).is_file():
            shutil.copy2(tokenizer_from / name, folder / name)
    done.write_text("")
    return folder


def measured(command: list[str], env: dict[str, str], allowed: tuple[int, ...] = (0,)) -> int:
    """Peak RSS in bytes of ``command`` run as a fresh child; its exit status must be in
    ``allowed`` (the tail of its stderr is shown otherwise)."""
    gnu_time = Path("/usr/bin/time").is_file()
    with tempfile.NamedTemporaryFile(suffix=".txt") as report:
        wrapped = (
            ["/usr/bin/time", "-f", "%M", "-o", report.name] if gnu_time else [sys.executable, "-c", WRAPPER]
        )
        done = subprocess.run([*wrapped, *command], env=env, capture_output=True, text=True)
        if done.returncode not in allowed:
            sys.exit(f"{' '.join(command[:6])} ... exited {done.returncode}:\n{done.stderr[-3000:]}")
        kib = Path(report.name).read_text() if gnu_time else done.stdout
    return int(kib.split()[-1]) * 1024


def eval_ids(model: Path, ids_path: Path) -> tuple[int, str]:
    """The eval windows a quantkit run of RECIPE with OVERRIDES scores, saved to ``ids_path``;
    with the batch size it scores them at and their hash."""
    import numpy as np
    from transformers import AutoTokenizer

    from quantkit.inputs.calibration import eval_windows
    from quantkit.inputs.recipe import load_recipe

    spec = load_recipe(RECIPE, OVERRIDES).eval
    windows = eval_windows(spec, AutoTokenizer.from_pretrained(model))
    np.save(ids_path, windows.ids)
    return spec.batch_size, windows.hash


def measure_shape(model: Path, work: Path, repeats: int) -> dict[str, object]:
    """Both sides' peaks for one model folder, alternating, each in a fresh subprocess."""
    ids_path = work / "ids.npy"
    batch, ids_hash = eval_ids(model, ids_path)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    peaks: dict[str, list[int]] = {"bare": [], "quantkit": []}
    for repeat in range(repeats):
        bare = [sys.executable, "-c", BARE, str(model), str(ids_path), str(batch)]
        peaks["bare"].append(measured(bare, env))
        run_dir, cache = work / f"run-{repeat}", work / f"cache-{repeat}"
        sets = [arg for item in OVERRIDES for arg in ("--set", item)]
        command = [sys.executable, "-m", "quantkit", "quantize", RECIPE, "--model", str(model), *sets]
        # random weights fail the baseline sanity guard; exit 1 is a gate verdict, the run is whole
        command += ["--no-bench", "--allow-implausible-baseline", "--out", str(run_dir), "--overwrite"]
        peaks["quantkit"].append(measured(command, env | {"QUANTKIT_CACHE": str(cache)}, allowed=(0, 1)))
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
        print(
            f"  repeat {repeat}: bare {peaks['bare'][-1] / 1e9:.2f} GB, "
            f"quantkit {peaks['quantkit'][-1] / 1e9:.2f} GB",
            flush=True,
        )
    bare_peak, run_peak = statistics.median(peaks["bare"]), statistics.median(peaks["quantkit"])
    return {
        "model": str(model),
        "eval": {"windows_hash": ids_hash, "batch_size": batch},
        "bare_peak_rss_bytes": bare_peak,
        "quantkit_peak_rss_bytes": run_peak,
        "ratio": run_peak / bare_peak,
        "raw": peaks,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="llama-1.17b,smollm2-135m")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--dtype",
        choices=["bfloat16", "float32"],
        default="bfloat16",
        help="the built Llama's stored dtype (bf16 as released Llamas are; both sides load it in fp32)",
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "quantkit-bench-memory",
        help="folder for the built model (kept and reused) and each run's scratch files",
    )
    parser.add_argument("--out", type=Path, default=HERE / "results" / "memory.json")
    args = parser.parse_args()

    from quantkit.inputs.models import resolve_model
    from quantkit.util.environment import library_versions

    smollm2 = resolve_model("smollm2-135m").path
    shapes: dict[str, object] = {}
    for shape in args.shapes.split(","):
        if shape == "llama-1.17b":
            model = build_llama(args.work / f"llama-1.17b-{args.dtype}", smollm2, args.dtype)
        elif shape == "smollm2-135m":
            model = smollm2
        else:
            parser.error(f"unknown shape {shape!r} (llama-1.17b, smollm2-135m)")
        print(f"{shape}:", flush=True)
        scratch = args.work / f"scratch-{shape}"
        scratch.mkdir(parents=True, exist_ok=True)
        try:
            shapes[shape] = measure_shape(model, scratch, args.repeats)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    figures = {
        "benchmark": "memory",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "quantkit_command": f"quantkit quantize {RECIPE} --model FOLDER "
        + " ".join(f"--set {item}" for item in OVERRIDES)
        + " --no-bench --allow-implausible-baseline",
        "target": TARGET,
        "repeats": args.repeats,
        "llama_dtype": args.dtype,
        "shapes": shapes,
        "libraries": library_versions(),
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    for shape, data in shapes.items():
        assert isinstance(data, dict)
        print(f"{shape}: peak RSS ratio {data['ratio']:.3f} (target <= {TARGET})")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
