"""`quantkit sensitivity` and `quantkit search`: bad input refused with one line and a hint before
anything runs (the tiny random Llama; its tokenizer does not convert to GGUF, so the searches
themselves are in tests/e2e/test_search_smollm2.py)."""

from __future__ import annotations

import json
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
        (["search", "--formats", "gguf,fp8", "--max-kld", "0.05"], "GPTQ/AWQ per-layer mixes, not fp8"),
        (
            ["search", "--formats", "gguf,gguf", "--max-kld", "0.05"],
            "--formats gguf,gguf names no format or one twice",
        ),
        (
            ["search", "--formats", "gguf,gptq", "--max-kld", "0.05", "--max-candidates", "1"],
            "--max-candidates must be at least 1 per format searched (2)",
        ),
        (["search", "--objective", "latency", "--max-kld", "0.05"], "unknown objective 'latency'"),
        (["search"], "give exactly one quality budget"),
        (["search", "--max-kld", "0.05", "--max-ppl-increase", "3%"], "give exactly one quality budget"),
        (["search", "--max-kld", "0"], "--max-kld 0 is not a positive KLD"),
        (["search", "--max-ppl-increase", "lots"], "--max-ppl-increase: 'lots' is not a number"),
        (["search", "--max-kld", "0.05", "--max-candidates", "0"], "--max-candidates must be at least 1"),
        (["sensitivity", "--low", "Q4_K"], "--low Q4_K is not a type the gguf sensitivity profile uses"),
        (
            ["sensitivity", "--formats", "gptq", "--low", "Q4_0"],
            "--low Q4_0 is not a type the gptq sensitivity",
        ),
        (
            ["sensitivity", "--formats", "gguf,gptq", "--low", "W4"],
            "--low W4 is not a type the gguf sensitivity",
        ),
        (["sensitivity", "--base", "Q4_0", "--low", "Q5_0"], "--low Q5_0 has no fewer bits than --base Q4_0"),
        (["sensitivity", "--formats", "rtn"], "GGUF per-tensor and GPTQ/AWQ per-layer mixes, not rtn"),
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
    from quantkit.llamacpp import convert as llama_cpp_convert

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


TINY = ["--set", "eval.num_windows=2", "--set", "eval.seq_len=32", "--set", "calibration.num_samples=4",
        "--set", "calibration.seq_len=32", "--device", "cpu"]  # fmt: skip


@pytest.fixture(scope="module")
def gptq_profile(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama's GPTQ profile, measured: each unit alone at W4, the rest at W8."""
    out = tmp_path_factory.mktemp("gptq-profile")
    assert (
        main(["sensitivity", "--formats", "gptq", "--model", str(tiny_model), "--out", str(out), *TINY]) == 0
    )
    return out / "sensitivity.json"


def test_a_gptq_profile_measures_every_layer_and_module_role(gptq_profile: Path) -> None:
    """In transformers, on the model's own module names: 2 layers + 7 roles, each measured."""
    profile = json.loads(gptq_profile.read_text())
    assert (profile["format"], profile["base"], profile["low"], profile["group_size"]) == (
        "gptq",
        "W8",
        "W4",
        128,
    )
    roles = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
    assert [u["unit"] for u in profile["units"]] == ["layer 0", "layer 1", *roles]
    assert {t["name"] for t in profile["tensors"]} >= {
        "model.layers.1.mlp.down_proj",
        "model.layers.0.self_attn.q_proj",
    }
    assert 0 <= profile["base_kld"] < 1e-3  # W8 everywhere: almost the baseline
    layers = [u["kld_increase"] for u in profile["units"] if u["kind"] == "layer"]
    assert all(value > 0 for value in layers) and all(u["proxy"] > 0 for u in profile["units"])
    assert profile["cost"]["measured_evaluations"] == 10
    assert profile["cost"]["measured_forward_passes"] == 20


def test_a_gptq_search_chooses_a_mixed_recipe_that_quantize_reproduces(
    tiny_model: Path, gptq_profile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Candidates are GPTQ recipes with per-layer overrides, run as a sweep; the winner's recipe
    re-run by `quantkit quantize` gives the same KLD and file size."""
    out = tmp_path / "search"
    args = ["search", "--formats", "gptq", "--model", str(tiny_model), "--max-kld", "0.0005",
            "--max-candidates", "2", "--profile", str(gptq_profile), "--out", str(out), "--format", "json",
            *TINY]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err
    record = json.loads((out / "search.json").read_text())
    assert record["formats"] == ["gptq"] and record["paths"][0]["steps"] == 14
    assert record["paths"][0]["profile"] == str(gptq_profile)
    chosen = next(c for c in record["candidates"] if c["name"] == record["chosen"])
    assert chosen["format"] == "gptq" and chosen["passed"] and chosen["kld"] <= 0.0005
    start, end = record["paths"][0]["bpw"]
    assert end < chosen["predicted_bpw"] < start  # a mix: some layers at W8, some at W4
    recipe = (out / "chosen-recipe.yaml").read_text()
    assert "method: gptq" in recipe and "overrides:" in recipe and "max_kld_mean: 0.0005" in recipe
    rerun = tmp_path / "rerun"
    assert main(["quantize", str(out / "chosen-recipe.yaml"), "--out", str(rerun), "--no-bench"]) == 0
    manifest = json.loads((rerun / "manifest.json").read_text())
    assert manifest["metrics"]["quantized"]["kld_mean"]["value"] == pytest.approx(chosen["kld"], rel=1e-6)
    assert manifest["artifact"]["file_bpw"] == chosen["bpw"]
    assert "sensitivity profile (gptq)" in (out / "report.html").read_text()


def test_a_profile_of_a_format_not_searched_is_refused(
    tiny_model: Path, gptq_profile: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    line, hint = refused(
        capsys, "search", "--formats", "gguf", "--model", str(tiny_model), "--max-kld", "0.1",
        "--profile", str(gptq_profile), "--out", str(tmp_path / "s"), *SMALL,
    )  # fmt: skip
    assert "is a gptq profile, not of --formats gguf" in line and "one --profile per format" in hint
    assert not (tmp_path / "s").exists()


def test_an_awq_search_proposes_awq_recipes_with_bits_only_overrides(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """AWQ's mixes: its own (asymmetric, zero-point) W8/W4 ladder from a proxy profile, and
    candidates that are AWQ recipes whose overrides change bits only (AWQ refuses the rest)."""
    out = tmp_path / "search"
    args = ["search", "--formats", "awq", "--model", str(tiny_model), "--max-kld", "0.05",
            "--max-candidates", "1", "--out", str(out), "--format", "json", *TINY]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err
    record = json.loads((out / "search.json").read_text())
    (path,) = record["paths"]
    assert (path["format"], path["group_size"], path["steps"]) == ("awq", 128, 14)
    assert path["bpw"][0] > path["bpw"][1]
    (candidate,) = record["candidates"]
    assert candidate["format"] == "awq" and candidate["passed"] and record["chosen"] == candidate["name"]
    assert path["bpw"][1] < candidate["predicted_bpw"] < path["bpw"][0]  # a W8/W4 mix
    profile = json.loads((out / "sensitivity.json").read_text())
    assert profile["format"] == "awq" and (profile["base"], profile["low"]) == ("W8", "W4")
    manifest = json.loads((out / "sweep" / "runs" / candidate["run_id"] / "manifest.json").read_text())
    assert manifest["recipe"]["method"] == "awq"
    options = manifest["recipe"]["options"]
    assert options["symmetric"] is False and options["overrides"]
    assert all(set(o) - {"targets"} == {"bits"} or o.get("group_size") is None for o in options["overrides"])
