"""`quantkit sensitivity` and `quantkit search`: bad input refused with one line and a hint before
anything runs (the tiny random Llama; its tokenizer does not convert to GGUF, so the searches
themselves are in tests/e2e/test_search_smollm2.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import require_extra

from quantkit.cli import main

require_extra("llama_cpp", "gguf")

SMALL = ["--set", "eval.num_windows=2", "--set", "eval.seq_len=32", "--set", "calibration.num_samples=2",
         "--set", "calibration.seq_len=32", "--device", "cpu"]  # fmt: skip


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[str, str]:
    code = main(list(args))
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert "Traceback" not in err and sum(line.startswith("error: ") for line in lines) == 1, err
    assert lines[-2].startswith("error: ") and lines[-1].startswith("hint: "), err
    return lines[-2], lines[-1]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["search", "--formats", "gguf,gptq", "--max-kld", "0.05"], "GGUF per-tensor mixes only, not gptq"),
        (["search", "--objective", "latency", "--max-kld", "0.05"], "unknown objective 'latency'"),
        (["search"], "give exactly one quality budget"),
        (["search", "--max-kld", "0.05", "--max-ppl-increase", "3%"], "give exactly one quality budget"),
        (["search", "--max-kld", "0"], "--max-kld 0 is not a positive KLD"),
        (["search", "--max-ppl-increase", "lots"], "--max-ppl-increase: 'lots' is not a number"),
        (["search", "--max-kld", "0.05", "--max-candidates", "0"], "--max-candidates must be at least 1"),
        (["sensitivity", "--low", "Q4_K"], "--low Q4_K is not a type the sensitivity profile uses"),
        (["sensitivity", "--base", "Q4_0", "--low", "Q5_0"], "--low Q5_0 has no fewer bits than --base Q4_0"),
        (["sensitivity", "--formats", "awq"], "covers GGUF per-tensor mixes only, not awq"),
        (["sensitivity", "--set", "eval.num_windowz=2"], "eval.num_windowz"),
    ],
)
def test_bad_input_is_one_line_with_a_hint(
    args: list[str], error: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    line, _hint = refused(capsys, *args)
    assert error in line
    assert list(tmp_path.iterdir()) == []


def test_a_model_llama_cpp_cannot_convert_is_refused(
    tiny_model: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from quantkit import llama_cpp_convert

    monkeypatch.setattr(llama_cpp_convert, "supported_architectures", lambda converter: {"GPT2LMHeadModel"})
    out = tmp_path / "search"
    line, hint = refused(
        capsys, "search", "--model", str(tiny_model), "--max-kld", "0.1", "--out", str(out), *SMALL
    )
    assert "does not support architecture 'LlamaForCausalLM'" in line and "supported include" in hint
    assert not (out / "search.json").exists()


def test_a_bad_profile_file_is_refused(
    tiny_model: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "profile.json"
    bad.write_text('{"model": 1}')
    line, hint = refused(
        capsys, "search", "--model", str(tiny_model), "--max-kld", "0.1", "--profile", str(bad),
        "--out", str(tmp_path / "s"), *SMALL,
    )  # fmt: skip
    assert "is not a sensitivity profile" in line and "sensitivity.json" in hint
