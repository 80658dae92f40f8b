"""AutoRound on the real SmolLM2-135M: its integer checkpoint beside round-to-nearest at the
same bits and group, and its GGUF export beside llama.cpp's own Q4_K_M; the same calibration
ids the GPTQ engines are fed, the same eval windows, and artifacts that load without quantkit.

Cost on 2 shared cores (the e2e budget: 8 x 256 calibration and eval tokens):
- AutoRound W4 g64, 8 tuning steps of 4 samples per block at lr 0.01 (its default is 200 x 8):
  ~1.5 min on an idle machine; its eval in transformers through auto-round-lib's CPU kernel
  in float32: seconds;
- RTN W4 g64 (data-free, llm-compressor): ~1 min;
- AutoRound's Q4_K_M at iters 0 (AutoRound's advice for GGUF: importance-weighted scales, no
  tuning): ~3-6 min, most of it AutoRound's Python k-quant packing;
- llama.cpp's Q4_K_M: ~1 min (F16 conversion cached per session); the checks: ~2 min.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import E2E_BUDGET, SharedRuns, require_extra

from quantkit.cli import main

pytestmark = pytest.mark.slow

require_extra("auto_round", "autoround")
require_extra("llama_cpp", "gguf")

RUNS = {
    "autoround": [
        "autoround-w4a16-g128", "--set", "options.group_size=64", "--set", "options.iters=8",
        "--set", "options.lr=0.01", "--set", "options.batch_size=4",
    ],
    "rtn": ["rtn-w4a16-g64"],
    "autoround-gguf": ["autoround-gguf-q4_k_m"],
    "llama.cpp": ["gguf-q4_k_m"],
}  # fmt: skip

# The hash of the ids llm-compressor's and GPTQModel's GPTQ were handed for SmolLM2 at 8 x 256
# calibration tokens (calibration_fed_hash in bench/results/engines.json, both engines).
GPTQ_ENGINES_FED_HASH = "9169e94bf9c1b7f0bace5627c000bb5325dcd7d001f393b623fa09447815d863"


@pytest.fixture(scope="module")
def runs(session_cache: Path, shared_runs: SharedRuns) -> dict[str, dict]:
    os.environ["QUANTKIT_CACHE"] = str(session_cache)
    manifests = {}
    for name, args in RUNS.items():
        # 1: a gate failed, the run is complete (checked per run below, so one run's gate does
        # not hide the others' checks)
        out, code = shared_runs.quantize(args[0], *E2E_BUDGET, *args[1:])
        manifests[name] = json.loads((out / "manifest.json").read_text()) | {"_path": str(out)}
        gate = manifests[name]["gate"]  # None: the recipe has no gates
        assert code == (1 if gate is not None and gate["passed"] is False else 0), (name, code)
    return manifests


def kld(manifest: dict) -> float:
    return manifest["metrics"]["quantized"]["kld_mean"]["value"]


@pytest.mark.parametrize("name", ["autoround", "autoround-gguf"])
def test_autoround_was_fed_the_gptq_engines_calibration_ids_and_scored_on_the_same_windows(
    runs: dict[str, dict], smollm2: Path, name: str
) -> None:
    """The ids AutoRound's model forward received, hashed as the GPTQ drivers hash what they
    hand their libraries: the hash of quantkit's own calibration windows, and the one both GPTQ
    engines recorded for these settings."""
    from transformers import AutoTokenizer

    from quantkit.backends.llmcompressor_run import fed_hash
    from quantkit.inputs.calibration import calibration_windows
    from quantkit.inputs.specs import CalibrationSpec

    run = runs[name]
    details = run["artifact"]["details"]
    windows = calibration_windows(
        CalibrationSpec(num_samples=8, seq_len=256), AutoTokenizer.from_pretrained(smollm2)
    )
    assert windows.hash == run["calibration"]["hash"]
    assert details["calibration_fed_rows"] == 8
    assert details["calibration_fed_hash"] == fed_hash([list(map(int, row)) for row in windows.ids])
    assert details["calibration_fed_hash"] == GPTQ_ENGINES_FED_HASH
    assert run["eval"]["reference_key"] == runs["rtn"]["eval"]["reference_key"]
    assert details["seed"] == run["seeds"]["run"] == runs["rtn"]["seeds"]["run"]
    assert details["engine"] == "autoround" and details["library"] == "auto-round"
    assert details["library_version"] == run["environment"]["libraries"]["auto-round"]
    expected = {
        "autoround": ("auto_round", "hf", "auto_round"),
        "autoround-gguf": ("gguf:q4_k_m", "llamacpp", "gguf"),
    }[name]
    assert (details["export_format"], run["artifact"]["runtime"], run["artifact"]["format"]) == expected


def test_rows_that_do_not_fit_k_quant_blocks_fall_back_as_in_llama_cpp(runs: dict[str, dict]) -> None:
    """SmolLM2's 576-wide rows are not a multiple of 256 (a k-quant super-block): AutoRound
    writes those tensors as Q5_0 (Q8_0 for some attn_v), and k-quants (Q4_K, Q6_K) only for the
    1536-wide ffn_down rows; llama.cpp's own Q4_K_M falls back too."""
    from quantkit.llamacpp.gguf_file import read_gguf

    path = Path(runs["autoround-gguf"]["_path"]) / "artifact" / "model.gguf"
    types = {tensor.name: tensor.type_name for tensor in read_gguf(path).tensors}
    print("AutoRound Q4_K_M tensor types:", runs["autoround-gguf"]["artifact"]["details"]["tensor_types"])
    print("llama.cpp Q4_K_M tensor types:", runs["llama.cpp"]["artifact"]["details"]["tensor_types"])
    assert types["blk.0.attn_q.weight"] == "Q5_0" and types["blk.0.ffn_up.weight"] == "Q5_0"
    assert {types[f"blk.{i}.ffn_down.weight"] for i in range(30)} <= {"Q4_K", "Q6_K"}
    assert "Q4_K" in {types[f"blk.{i}.ffn_down.weight"] for i in range(30)}
    bpw = runs["autoround-gguf"]["artifact"]["weight_bits"]
    assert 4.5 < bpw < 7  # mostly 5.5-bit Q5_0, as the fallback costs
    assert runs["autoround-gguf"]["artifact"]["scheme"] == "Q4_K_M (AutoRound)"


def test_autoround_gguf_is_as_close_as_llama_cpps_own_q4_k_m(runs: dict[str, dict]) -> None:
    ours, theirs = runs["autoround-gguf"], runs["llama.cpp"]
    print(
        f"KLD: AutoRound Q4_K_M {kld(ours):.4f}, llama.cpp Q4_K_M {kld(theirs):.4f}; ppl "
        f"{ours['metrics']['quantized']['ppl']['value']:.3f} vs "
        f"{theirs['metrics']['quantized']['ppl']['value']:.3f} (baseline "
        f"{ours['metrics']['baseline']['ppl']['value']:.3f})"
    )
    # a broken export (wrong scales, shuffled rows) scores KLD > 1 on SmolLM2; both are ~0.05
    assert kld(ours) < 0.2 and ours["gate"]["passed"] is True
    assert kld(ours) < 1.5 * kld(theirs)


def test_the_autoround_gguf_loads_in_plain_llama_cpp_and_generates(runs: dict[str, dict]) -> None:
    path = Path(runs["autoround-gguf"]["_path"]) / "artifact" / "model.gguf"
    script = (
        "import sys\n"
        "from llama_cpp import Llama\n"
        f"llm = Llama(model_path={str(path)!r}, n_ctx=256, verbose=False)\n"
        "out = llm('A for loop in Python', max_tokens=8, temperature=0)\n"
        "assert 'quantkit' not in sys.modules\n"
        "print(repr(out['choices'][0]['text']))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() not in ("", "''")


def test_the_report_names_autoround_in_the_method_column(runs: dict[str, dict], tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    assert (
        main(["report", runs["llama.cpp"]["_path"], runs["autoround-gguf"]["_path"], "-o", str(report)]) == 0
    )
    rows = json.loads(report.read_text())["rows"]
    assert [(row["method"], row["scheme"]) for row in rows[1:]] == [
        ("gguf", "Q4_K_M"),
        ("autoround", "Q4_K_M (AutoRound)"),
    ]
    assert main(["report", runs["rtn"]["_path"], runs["autoround"]["_path"], "-o", str(report)]) == 0
    rows = json.loads(report.read_text())["rows"]
    assert [(row["method"], row["scheme"]) for row in rows[1:]] == [
        ("rtn", "W4A16-g64"),
        ("autoround", "W4A16-g64"),
    ]


# --- the integer checkpoint -----------------------------------------------------------------------


def test_autoround_beats_round_to_nearest_at_the_same_bits(runs: dict[str, dict]) -> None:
    """8 steps at lr 0.01 (docs/recipes.md: at AutoRound's default lr 1/8 the tuning makes the
    rounding worse than none) take W4 g64 well below round-to-nearest's KLD. A broken export
    (wrong scales or packing) scores KLD > 1; untuned min-max rounding ~0.4-0.5."""
    ar, rtn = runs["autoround"], runs["rtn"]
    assert ar["artifact"]["scheme"] == rtn["artifact"]["scheme"] == "W4A16-g64"
    ppl = {name: runs[name]["metrics"]["quantized"]["ppl"]["value"] for name in ("autoround", "rtn")}
    print(
        f"KLD: autoround {kld(ar):.4f}, RTN {kld(rtn):.4f}; ppl {ppl} (baseline "
        f"{ar['metrics']['baseline']['ppl']['value']:.3f})"
    )
    assert kld(ar) < 0.25 and ar["gate"]["passed"] is True
    assert kld(ar) < 0.7 * kld(rtn)
    assert (ar["artifact"]["details"]["iters"], ar["artifact"]["details"]["lr"]) == (8, 0.01)


def test_autoround_block_losses_come_from_its_own_tuning(runs: dict[str, dict]) -> None:
    """One row per decoder block: the block-output MSE at AutoRound's first step and at the step
    it kept; the tuning lowers it in most blocks."""
    errors = runs["autoround"]["artifact"]["details"]["layer_errors"]
    assert [e["module"] for e in errors] == [f"model.layers.{i}" for i in range(30)]
    assert all(e["method"] == "AutoRound" and e["iters"] == 8 for e in errors)
    assert all(0 < e["best_loss"] <= e["initial_loss"] for e in errors)
    improved = [e for e in errors if e["best_loss"] < e["initial_loss"]]
    print(f"AutoRound lowered the block loss in {len(improved)} of 30 blocks")
    assert len(improved) >= 15


def test_autoround_artifact_loads_in_plain_transformers_with_quantkits_scores(
    runs: dict[str, dict], smollm2: Path, tmp_path: Path
) -> None:
    """transformers (auto-round and its kernel library installed, quantkit not imported) loads
    the auto_round checkpoint into AutoRound's packed CPU kernel, in float32 (without
    auto-round-lib AutoRound casts it to float16, ~60x slower), and scores the first eval
    windows as quantkit did."""
    from transformers import AutoTokenizer

    from quantkit.inputs.calibration import eval_windows
    from quantkit.inputs.specs import EvalSpec

    run = runs["autoround"]
    windows = eval_windows(EvalSpec(num_windows=8, seq_len=256), AutoTokenizer.from_pretrained(smollm2))
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps(windows.ids[:2].tolist()))
    artifact = str(Path(run["_path"]) / "artifact")
    script = (
        "import json, sys, torch\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f"model = AutoModelForCausalLM.from_pretrained({artifact!r}, dtype=torch.float32)\n"
        f"tok = AutoTokenizer.from_pretrained({artifact!r})\n"
        f"ids = torch.tensor(json.load(open({str(ids)!r})))\n"
        "with torch.no_grad():\n"
        "    logp = torch.log_softmax(model(ids).logits[:, :-1].float(), -1)\n"
        "nll = -logp.gather(-1, ids[:, 1:, None])[..., 0].mean(-1)\n"
        "prompt = tok('A for loop in Python', return_tensors='pt').input_ids\n"
        "out = model.generate(prompt, max_new_tokens=8, do_sample=False)\n"
        "assert out.shape[1] == prompt.shape[1] + 8 and 'quantkit' not in sys.modules\n"
        "print(type(model.model.layers[0].mlp.down_proj).__name__, model.dtype, json.dumps(nll.tolist()))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    kernel, dtype, nll = result.stdout.strip().splitlines()[-1].split(" ", 2)
    assert kernel != "Linear"  # AutoRound's packed kernel, not dequantized weights
    assert dtype == "torch.float32"
    scored = json.loads((Path(run["_path"]) / "eval_windows.json").read_text())["quantized"]["nll_mean"]
    assert json.loads(nll) == pytest.approx(scored[:2], abs=2e-3)


@pytest.mark.parametrize("name", ["autoround", "autoround-gguf"])
def test_plan_estimates_the_artifact_within_5_percent(
    runs: dict[str, dict], name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The integer checkpoint as any W4 g64 one (linear layers at 4.25 bits, the rest in the
    source's fp16); AutoRound's GGUF with llama.cpp's type rules for Q4_K_M (the fallbacks)."""
    from quantkit.inputs.plan import tensor_bytes

    artifact = Path(runs[name]["_path"]) / "artifact"
    actual = (artifact / "model.gguf").stat().st_size if name == "autoround-gguf" else tensor_bytes(artifact)
    capsys.readouterr()
    assert main(["plan", *RUNS[name], "--format", "json"]) == 0
    estimate = json.loads(capsys.readouterr().out)["quantized_weights_bytes"]
    print(f"{name}: plan {estimate} bytes, artifact {actual} bytes")
    assert estimate == pytest.approx(actual, rel=0.05)
