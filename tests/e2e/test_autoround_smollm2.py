"""AutoRound's GGUF export on the real SmolLM2-135M, beside llama.cpp's own Q4_K_M: same
calibration ids, same eval windows, both scored by llama.cpp. (AutoRound's integer checkpoint
runs in test_weight_only_smollm2.py, beside the GPTQ engines and RTN.)

Cost on 2 shared cores: AutoRound's Q4_K_M at iters 0 (AutoRound's advice for GGUF: no tuning;
importance-weighted scales from the 8 x 256 calibration tokens) ~2-4 min; llama.cpp's Q4_K_M
~1 min (its F16 conversion cached for the session); the checks themselves ~1 min."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import E2E_BUDGET, require_extra

from quantkit.cli import main

pytestmark = pytest.mark.slow

require_extra("auto_round", "autoround")
require_extra("llama_cpp", "gguf")

RUNS = {
    "autoround": ["autoround-gguf-q4_k_m"],
    "llama.cpp": ["gguf-q4_k_m"],
}


@pytest.fixture(scope="module")
def runs(session_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    os.environ["QUANTKIT_CACHE"] = str(session_cache)
    root = tmp_path_factory.mktemp("autoround-gguf")
    manifests = {}
    for name, args in RUNS.items():
        out = root / name
        # both pass the Q4_K_M recipes' gate (max_kld 0.2)
        assert main(["quantize", args[0], "--out", str(out), *E2E_BUDGET, *args[1:]]) == 0
        manifests[name] = json.loads((out / "manifest.json").read_text()) | {"_path": str(out)}
    return manifests


def kld(manifest: dict) -> float:
    return manifest["metrics"]["quantized"]["kld_mean"]["value"]


def test_autoround_was_fed_quantkits_calibration_ids_and_scored_on_the_same_windows(
    runs: dict[str, dict], smollm2: Path
) -> None:
    """The ids AutoRound's model forward received, hashed as the GPTQ drivers hash what they
    hand their libraries: equal to the hash of quantkit's own calibration windows."""
    from transformers import AutoTokenizer

    from quantkit.backends.llmcompressor_run import fed_hash
    from quantkit.calibration import calibration_windows
    from quantkit.specs import CalibrationSpec

    run = runs["autoround"]
    details = run["artifact"]["details"]
    windows = calibration_windows(
        CalibrationSpec(num_samples=8, seq_len=256), AutoTokenizer.from_pretrained(smollm2)
    )
    assert windows.hash == run["calibration"]["hash"]
    assert details["calibration_fed_rows"] == 8
    assert details["calibration_fed_hash"] == fed_hash([list(map(int, row)) for row in windows.ids])
    assert run["eval"]["reference_key"] == runs["llama.cpp"]["eval"]["reference_key"]
    assert details["library"] == "auto-round" and details["export_format"] == "gguf:q4_k_m"
    assert details["library_version"] == run["environment"]["libraries"]["auto-round"]
    assert run["artifact"]["runtime"] == "llamacpp" and run["artifact"]["format"] == "gguf"


def test_rows_that_do_not_fit_k_quant_blocks_fall_back_as_in_llama_cpp(runs: dict[str, dict]) -> None:
    """SmolLM2's 576-wide rows are not a multiple of 256 (a k-quant super-block): AutoRound
    writes those tensors as Q5_0 (Q8_0 for some attn_v), and k-quants (Q4_K, Q6_K) only for the
    1536-wide ffn_down rows; llama.cpp's own Q4_K_M falls back too."""
    from quantkit.gguf_file import read_gguf

    path = Path(runs["autoround"]["_path"]) / "artifact" / "model.gguf"
    types = {tensor.name: tensor.type_name for tensor in read_gguf(path).tensors}
    print("AutoRound Q4_K_M tensor types:", runs["autoround"]["artifact"]["details"]["tensor_types"])
    print("llama.cpp Q4_K_M tensor types:", runs["llama.cpp"]["artifact"]["details"]["tensor_types"])
    assert types["blk.0.attn_q.weight"] == "Q5_0" and types["blk.0.ffn_up.weight"] == "Q5_0"
    assert {types[f"blk.{i}.ffn_down.weight"] for i in range(30)} <= {"Q4_K", "Q6_K"}
    assert "Q4_K" in {types[f"blk.{i}.ffn_down.weight"] for i in range(30)}
    bpw = runs["autoround"]["artifact"]["weight_bits"]
    assert 4.5 < bpw < 7  # mostly 5.5-bit Q5_0, as the fallback costs
    assert runs["autoround"]["artifact"]["scheme"] == "Q4_K_M (AutoRound)"


def test_autoround_gguf_is_as_close_as_llama_cpps_own_q4_k_m(runs: dict[str, dict]) -> None:
    ours, theirs = runs["autoround"], runs["llama.cpp"]
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
    path = Path(runs["autoround"]["_path"]) / "artifact" / "model.gguf"
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
    assert main(["report", runs["llama.cpp"]["_path"], runs["autoround"]["_path"], "-o", str(report)]) == 0
    rows = json.loads(report.read_text())["rows"]
    assert [(row["method"], row["scheme"]) for row in rows[1:]] == [
        ("gguf", "Q4_K_M"),
        ("autoround", "Q4_K_M (AutoRound)"),
    ]
