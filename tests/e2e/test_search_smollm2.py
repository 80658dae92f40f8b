"""`quantkit sensitivity` and `quantkit search` on the real SmolLM2-135M, on small budgets.

Cost on the 2-core CPU machine (SmolLM2 converted in the session cache): about 1.5-2 minutes —
three llama.cpp quantizations and a splice, a proxy profile (one pass over 4 x 128 calibration
tokens and numpy quantization of sampled rows), two candidates evaluated as a sweep on 4 x 128
eval tokens, and the chosen recipe re-run once by `quantkit quantize`. The measured profile
(two quantizations + 40 evaluations) and the issue's target are in bench/search_cost.py.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from conftest import require_extra

from quantkit.cli import main

pytestmark = pytest.mark.slow

require_extra("llama_cpp", "gguf")

SMALL = ["--set", "eval.num_windows=4", "--set", "eval.seq_len=128", "--set", "calibration.num_samples=4",
         "--set", "calibration.seq_len=128", "--device", "cpu"]  # fmt: skip


def test_a_spliced_file_is_what_llama_cpp_writes_with_the_override(smollm2: Path, tmp_path: Path) -> None:
    """The measured profile's shortcut: splicing an all-Q8_0 and an all-Q4_0 file gives the bytes
    llama-quantize writes for Q8_0 with one layer overridden to Q4_0."""
    from quantkit.backends.gguf import GGUFBackend, GGUFOptions, llama_quantize
    from quantkit.llamacpp.gguf_file import read_gguf
    from quantkit.llamacpp.gguf_splice import splice

    source = GGUFBackend(GGUFOptions(type="Q8_0")).runtime_baseline(smollm2, lambda message: None)
    assert source is not None

    def quantize(options: dict[str, object], name: str) -> Path:
        llama_quantize(source, tmp_path / name, GGUFOptions.model_validate(options), None)
        return tmp_path / name

    base = quantize({"type": "Q8_0"}, "base.gguf")
    low = quantize({"type": "Q8_0", "tensor_types": {r"\.weight$": "Q4_0"}}, "low.gguf")
    direct = quantize({"type": "Q8_0", "tensor_types": {r"^blk\.7\.": "Q4_0"}}, "direct.gguf")
    names = [t.name for t in read_gguf(base).tensors if t.name.startswith("blk.7.") and len(t.shape) > 1]
    assert len(names) == 7
    splice(base, low, names, tmp_path / "spliced.gguf")
    digest = [hashlib.sha256(path.read_bytes()).hexdigest() for path in (direct, tmp_path / "spliced.gguf")]
    assert digest[0] == digest[1]


@pytest.fixture(scope="module")
def searched(session_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    os.environ["QUANTKIT_CACHE"] = str(session_cache)
    out = tmp_path_factory.mktemp("search") / "search"
    args = ["search", "--formats", "gguf,gptq", "--max-kld", "0.08", "--max-candidates", "3", "--seed", "1",
            "--out", str(out)]  # fmt: skip
    assert main([*args, *SMALL, "--format", "json"]) == 0
    return out, json.loads((out / "search.json").read_text())


def test_search_writes_candidates_a_report_a_profile_and_a_recipe(searched: tuple[Path, dict]) -> None:
    """Two formats, one sweep: up to two GGUF candidates, then one GPTQ; the winner is the
    smallest file that met the budget, whichever its format."""
    out, record = searched
    formats = [c["format"] for c in record["candidates"]]
    assert formats in (["gguf", "gptq"], ["gguf", "gguf", "gptq"]) and record["chosen"], formats
    chosen = next(c for c in record["candidates"] if c["name"] == record["chosen"])
    assert chosen["passed"] and chosen["kld"] <= 0.08
    met = [c for c in record["candidates"] if c["passed"]]
    assert chosen["bpw"] == min(c["bpw"] for c in met)
    assert chosen["bpw"] < 8.5  # something was demoted from the all-Q8_0 start
    gptq = next(c for c in record["candidates"] if c["format"] == "gptq")
    start, end = next(p["bpw"] for p in record["paths"] if p["format"] == "gptq")
    assert end < gptq["predicted_bpw"] < start and 6.5 < gptq["bpw"] < 10.5  # a W8/W4 mix, 16-bit embedding
    assert 0 < gptq["kld"] < 1.0  # measured in transformers against the same reference
    files = (
        "search.json",
        "sweep/sweep.json",
        "report.html",
        "sensitivity-gguf.json",
        "sensitivity-gptq.json",
    )
    for name in (*files, "chosen-recipe.yaml", f"candidates/{gptq['name']}.yaml"):
        assert (out / name).is_file(), name
    assert "overrides:" in (out / "candidates" / f"{gptq['name']}.yaml").read_text()
    # library output (e.g. the GPTQ candidate's llm-compressor lines) in logs, not on the terminal
    assert (out / "library.log").read_text().startswith("== ")
    candidate_log = out / "sweep" / "runs" / gptq["name"] / "library.log"
    logged = candidate_log.read_text()  # llm-compressor's or compressed-tensors' loguru lines
    assert "llmcompressor" in logged or "compressed_tensors" in logged, logged[:2000]
    html = (out / "report.html").read_text()
    assert "sensitivity profile (gguf)" in html and "sensitivity profile (gptq)" in html and "<svg" in html
    print(json.dumps(record["candidates"], indent=1), record["why"])


def test_the_chosen_recipe_rerun_by_quantize_reproduces_the_chosen_artifact(
    searched: tuple[Path, dict], tmp_path: Path
) -> None:
    out, record = searched
    chosen = next(c for c in record["candidates"] if c["name"] == record["chosen"])
    rerun = tmp_path / "rerun"
    assert main(["quantize", str(out / "chosen-recipe.yaml"), "--out", str(rerun), "--no-bench"]) == 0
    manifest = json.loads((rerun / "manifest.json").read_text())
    assert manifest["metrics"]["quantized"]["kld_mean"]["value"] == pytest.approx(chosen["kld"], rel=1e-6)
    assert manifest["artifact"]["details"]["bits_per_weight"] == chosen["bpw"]
    assert manifest["gate"]["passed"] is True  # the budget is the recipe's gate


def test_a_budget_no_candidate_meets_exits_1_naming_the_closest(
    searched: tuple[Path, dict], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Reuses the searched folder's profile through --profile: one candidate, no profile pass."""
    out, profile = tmp_path / "search", searched[0] / "sensitivity-gguf.json"
    args = ["search", "--max-kld", "1e-6", "--max-candidates", "1", "--profile", str(profile), "-o", str(out)]
    code = main([*args, *SMALL])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "error: no candidate met KLD <= 1e-06; the closest was search-01" in err
    assert not (out / "chosen-recipe.yaml").exists()


def test_the_proxy_ranks_the_layers_like_the_measured_profile(searched: tuple[Path, dict]) -> None:
    """#17's bar for a proxy: Spearman >= 0.8 over SmolLM2's 30 layers against the measured
    profile (bench/results/sensitivity_smollm2.json: each layer alone at Q4_0, the rest Q8_0,
    scored in llama.cpp). The search's own proxy here (4 x 128 calibration tokens) scores 0.83;
    the error in absolute terms, without the residual stream's norm, scored -0.17. The same for
    GPTQ's integer proxy against bench/results/sensitivity_smollm2_gptq.json (each layer alone
    at W4 g64, the rest W8, rounded in transformers)."""
    from quantkit.search.profile import spearman

    out, _ = searched
    for fmt, measured_file in (
        ("gguf", "sensitivity_smollm2.json"),
        ("gptq", "sensitivity_smollm2_gptq.json"),
    ):
        profile = json.loads((out / f"sensitivity-{fmt}.json").read_text())
        proxy = {u["unit"]: u["proxy"] for u in profile["units"]}
        bench = Path(__file__).parents[2] / "bench" / "results" / measured_file
        measured = {u["unit"]: u["kld_increase"] for u in json.loads(bench.read_text())["units"]}
        layers = [f"layer {i}" for i in range(30)]
        rho = spearman([proxy[name] for name in layers], [measured[name] for name in layers])
        print(f"{fmt}: Spearman proxy vs measured over the layers: {rho:.3f}")
        assert rho is not None and rho >= 0.8, fmt


def test_a_decode_search_benches_its_candidate_and_chooses_by_the_measured_speed(
    session_cache: Path, tmp_path: Path
) -> None:
    """--objective decode: the sweep measures the candidate's decode speed and peak memory in
    llama.cpp (the bench), and the record chooses and explains by that measurement. One
    candidate keeps this affordable; the ranking of several by speed is
    tests/unit/test_search_logic.py::test_the_winner_is_the_best_at_the_objective_among_those_that_met_the_budget."""
    os.environ["QUANTKIT_CACHE"] = str(session_cache)
    out = tmp_path / "search"
    args = [
        "search",
        "--max-kld",
        "0.08",
        "--max-candidates",
        "1",
        "--objective",
        "decode",
        "--out",
        str(out),
    ]
    bench = [
        "--set",
        "bench.prompt_lengths=[32]",
        "--set",
        "bench.decode_tokens=8",
        "--set",
        "bench.repeats=1",
    ]
    assert main([*args, *SMALL, *bench, "--format", "json"]) == 0
    record = json.loads((out / "search.json").read_text())
    assert record["objective"] == "decode"
    (candidate,) = record["candidates"]
    print(json.dumps(candidate, indent=1), record["why"])
    assert candidate["decode_tok_s"] > 1 and 50e6 < candidate["peak_memory_bytes"] < 4e9
    assert record["chosen"] == candidate["name"]
    assert f"{candidate['decode_tok_s']:.1f} tokens/s decode" in record["why"]
    assert "the fastest measured decode" in record["why"]
