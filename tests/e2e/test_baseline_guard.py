"""The baseline sanity guard on real weights: SmolLM2 with its weights shuffled, or with a
tokenizer that is not its own, is refused before quantizing; let through, every figure is
flagged; an implausible artifact fails every gate."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from quantkit.cli import main

pytestmark = pytest.mark.slow

# the budget of test_smollm2.py, so the SmolLM2 reference is computed once for both
BUDGET = ["--set", "eval.num_windows=8", "--set", "eval.seq_len=256", "--device", "cpu", "--no-bench"]
# 765 scored tokens for the models refused: the guard judges from 512
SMALL = ["--set", "eval.num_windows=3", "--set", "eval.seq_len=256", "--device", "cpu", "--no-bench"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@pytest.fixture(scope="module")
def shuffled(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 with the elements of every weight tensor permuted (seeded): same shapes, same
    tokenizer, no knowledge."""
    import torch
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("guard") / "shuffled"
    shutil.copytree(smollm2, out)
    tensors = load_file(out / "model.safetensors")
    generator = torch.Generator().manual_seed(0)
    for name, tensor in tensors.items():
        flat = tensor.reshape(-1)
        tensors[name] = flat[torch.randperm(flat.numel(), generator=generator)].reshape(tensor.shape)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def foreign_tokenizer(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2's weights beside another tokenizer (a 384-token BPE): every id is in range, so
    only the figures can tell."""
    from quantkit.util.testing import make_tiny_tokenizer

    out = tmp_path_factory.mktemp("guard") / "foreign-tokenizer"
    shutil.copytree(smollm2, out)
    for name in TOKENIZER_FILES:
        (out / name).unlink(missing_ok=True)
    make_tiny_tokenizer(out)
    return out


def _refusal(capsys: pytest.CaptureFixture[str]) -> tuple[float, str]:
    err = " ".join(capsys.readouterr().err.split())  # one line, however the terminal wrapped it
    pattern = r"the baseline is implausible on the eval text \(765 tokens\): ppl (\S+) is not below"
    found = re.search(pattern, err)
    assert found is not None, err
    return float(found.group(1)), err


@pytest.mark.parametrize("model", ["shuffled", "foreign_tokenizer"])
def test_a_model_that_does_not_model_the_text_is_refused(
    model: str, request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder: Path = request.getfixturevalue(model)
    out = tmp_path / "run"
    assert main(["quantize", "fp8-dynamic", "--model", str(folder), "--out", str(out), *SMALL]) == 2
    ppl, err = _refusal(capsys)
    assert ppl > 1000  # SmolLM2's own: ~20 on these tokens
    assert "--allow-implausible-baseline goes on anyway" in err
    assert not out.exists() and not list(tmp_path.glob(".run*"))  # nothing made, nothing kept


def test_let_through_the_run_says_so_everywhere(shuffled: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["eval", "--baseline", str(shuffled), str(shuffled), "--out", str(out), *SMALL]
    assert main(args) == 2  # the same guard in front of `eval --baseline`
    assert main([*args, "--allow-implausible-baseline"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["eval"]["baseline_check"] == "implausible"
    baseline = manifest["metrics"]["baseline"]
    assert baseline["ppl"]["value"] > baseline["unigram_ppl"]["value"] > 100
    report = json.loads((out / "report.json").read_text())
    assert any(text.startswith("the baseline is implausible on the eval text") for text in report["warnings"])
    assert "every figure against it is suspect" in (out / "report.md").read_text()


def test_an_implausible_artifact_fails_every_gate(
    smollm2: Path, shuffled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    args = ["eval", "--baseline", str(smollm2), str(shuffled), "--out", str(out), *BUDGET]
    assert main([*args, "--set", "gates.max_kld_mean=1000"]) == 1  # the KLD bound passes; plausibility fails
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["eval"]["baseline_check"] == "passed"
    checks = {(c["field"], c["metric"]): c for c in manifest["gate"]["checks"]}
    assert checks[("max_kld_mean", "kld_mean")]["passed"] is True
    assert checks[("plausibility", "ppl")]["passed"] is False
    assert checks[("plausibility", "top1_accuracy_pct")]["passed"] is False
    unigram = manifest["metrics"]["baseline"]["unigram_ppl"]["value"]
    assert checks[("plausibility", "ppl")]["threshold"] == pytest.approx(unigram)
    report = json.loads((out / "report.json").read_text())
    warning = r"shuffled is implausible: ppl \S+ is not below"
    assert any(re.match(warning, text) for text in report["warnings"])
    capsys.readouterr()
    assert main(["gate", str(out), "--max-kld", "1000"]) == 1  # the stored run, gated again
    captured = capsys.readouterr()
    shown = " ".join((captured.out + captured.err).split())
    assert re.search(r"ppl = \S+ \(required <= \S+\): FAILED", shown), shown
    assert "top1_accuracy_pct = 0 (required >= " in shown
