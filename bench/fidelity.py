"""Fidelity: quantkit's ppl and KLD for a GGUF against llama.cpp's own ``llama-perplexity``.

``llama-perplexity`` is built from the llama-cpp-python sdist of the installed version (the
same llama.cpp commit as the bindings quantkit scores with) and cached next to the converter.
On English text neither project wrote (GPL-3 + Apache-2.0, ``tests/data/fidelity/``: 9,854
tokens of SmolLM2, 19 windows of 512), quantkit quantizes SmolLM2-135M to Q8_0 and Q4_K_M with
``eval.score: second_half`` (llama-perplexity's scored positions); llama-perplexity scores the
same GGUF files against the F16 GGUF they were quantized from (``--kl-divergence-base``).
Targets: ppl within 0.5 %, mean KLD within 2 %. Exit 1 when missed. Written to
``bench/results/fidelity.json``; ``make fidelity`` runs it.

    .venv/bin/python bench/fidelity.py [--types q8_0,q4_k_m] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEXT = HERE.parent / "tests" / "data" / "fidelity" / "licences.txt"
SEQ_LEN, WINDOWS = 512, 19
PPL_TOLERANCE_PCT, KLD_TOLERANCE_PCT = 0.5, 2.0

# llama-perplexity's summary lines (tools/perplexity/perplexity.cpp)
_PATTERNS = {
    "ppl": r"Mean PPL\(Q\)\s*:\s*([0-9.]+)",
    "ppl_base": r"Mean PPL\(base\)\s*:\s*([0-9.]+)",
    "kld_mean": r"Mean\s+KLD:\s*([0-9.]+)\s*±\s*([0-9.]+)",
    "same_top_p_pct": r"Same top p:\s*([0-9.]+)",
}


def parse_kld_output(text: str) -> dict[str, float]:
    """The figures of a ``llama-perplexity --kl-divergence`` run's summary."""
    figures: dict[str, float] = {}
    for name, pattern in _PATTERNS.items():
        match = re.search(pattern, text)
        if match is None:
            raise ValueError(f"llama-perplexity output has no {name!r} line")
        figures[name] = float(match[1])
        if name == "kld_mean":
            figures["kld_mean_stderr"] = float(match[2])
    return figures


def parse_final_ppl(text: str) -> float:
    """``Final estimate: PPL = X +/- Y`` of a plain llama-perplexity run."""
    match = re.search(r"Final estimate: PPL = ([0-9.]+)", text)
    if match is None:
        raise ValueError("llama-perplexity output has no final PPL estimate")
    return float(match[1])


def llama_perplexity(jobs: int = 2) -> Path:
    """The cached ``llama-perplexity`` of the installed bindings' llama.cpp, built on first use."""
    from quantkit.llamacpp.build import build_tool

    return build_tool("llama-perplexity", jobs, log=lambda message: print(message, flush=True))


def _run_perplexity(binary: Path, model: Path, args: list[str], threads: int) -> str:
    command = [str(binary), "-m", str(model), "-f", str(TEXT), "-c", str(SEQ_LEN), "-b", str(SEQ_LEN)]
    result = subprocess.run([*command, "-t", str(threads), *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"llama-perplexity failed on {model}:\n{result.stderr[-2000:]}")
    return result.stdout + result.stderr


def _quantkit_run(recipe: str, out: Path) -> dict:
    from quantkit.cli import main as quantkit

    settings = {
        "eval.source": str(TEXT),
        "eval.seq_len": SEQ_LEN,
        "eval.num_windows": WINDOWS,
        "eval.score": "second_half",
        "bench.enabled": "false",
    }
    sets = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    code = quantkit(["quantize", recipe, "--out", str(out), *sets, "--device", "cpu"])
    if code != 0:
        raise RuntimeError(f"quantkit quantize {recipe} exited {code}")
    return json.loads((out / "manifest.json").read_text())


def _pct(ours: float, theirs: float) -> float:
    return (ours / theirs - 1) * 100


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="q8_0,q4_k_m", help="GGUF recipes gguf-<type> to check")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "fidelity.json")
    args = parser.parse_args()

    from quantkit.llamacpp.convert import bindings_version
    from quantkit.util.environment import library_versions
    from quantkit.util.fileio import file_sha256

    binary = llama_perplexity(args.threads)
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        base_logits = Path(tmp) / "base.kld"
        f16: dict | None = None
        for name in args.types.split(","):
            manifest = _quantkit_run(f"gguf-{name}", Path(tmp) / name)
            source = manifest["artifact"]["details"]["source_gguf"]
            if f16 is None:  # the F16 GGUF every type was quantized from: llama.cpp's baseline
                base_args = ["--kl-divergence-base", str(base_logits)]
                text = _run_perplexity(binary, Path(source["path"]), base_args, args.threads)
                f16 = {"sha256": source["sha256"], "ppl": parse_final_ppl(text)}
                f16["quantkit_baseline_ppl"] = manifest["metrics"]["baseline"]["ppl"]["value"]
                f16["logits_file_bytes"] = base_logits.stat().st_size
            gguf = Path(tmp) / name / "artifact" / "model.gguf"
            kld_args = ["--kl-divergence-base", str(base_logits), "--kl-divergence"]
            theirs = parse_kld_output(_run_perplexity(binary, gguf, kld_args, args.threads))
            metrics = manifest["metrics"]["quantized"]
            ours = {key: metrics[key]["value"] for key in ("ppl", "kld_mean", "top1_agreement_pct")}
            rows[name] = {
                "gguf_sha256": file_sha256(gguf),
                "scheme": manifest["artifact"]["scheme"],
                "llama_perplexity": theirs,
                "quantkit": ours,
                "ppl_diff_pct": _pct(ours["ppl"], theirs["ppl"]),
                "kld_diff_pct": _pct(ours["kld_mean"], theirs["kld_mean"]),
                "top1_diff_points": ours["top1_agreement_pct"] - theirs["same_top_p_pct"],
            }
    passed = all(
        abs(row["ppl_diff_pct"]) <= PPL_TOLERANCE_PCT and abs(row["kld_diff_pct"]) <= KLD_TOLERANCE_PCT
        for row in rows.values()
    )
    assert f16 is not None
    result = {
        "what": "quantkit (eval.score=second_half) vs llama-perplexity on the same GGUF files and text",
        "model": "smollm2-135m",
        "text": {"path": str(TEXT.relative_to(HERE.parent)), "sha256": file_sha256(TEXT)},
        "protocol": {"seq_len": SEQ_LEN, "windows": WINDOWS, "scored": "second half of each window"},
        "llama_cpp_python": bindings_version(),
        "tolerance_pct": {"ppl": PPL_TOLERANCE_PCT, "kld": KLD_TOLERANCE_PCT},
        "f16": f16,
        "types": rows,
        "passed": passed,
        "versions": library_versions(),
        "machine": {"platform": platform.platform(), "threads": args.threads},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, row in rows.items():
        print(
            f"{name}: ppl {row['quantkit']['ppl']:.4f} vs {row['llama_perplexity']['ppl']:.4f} "
            f"({row['ppl_diff_pct']:+.3f} %), KLD {row['quantkit']['kld_mean']:.5f} vs "
            f"{row['llama_perplexity']['kld_mean']:.5f} ({row['kld_diff_pct']:+.2f} %)"
        )
    print(f"wrote {args.out}: {'within' if passed else 'OUTSIDE'} the tolerances")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
