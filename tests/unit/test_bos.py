"""The BOS rule: windows and lm-eval contexts start with BOS exactly when the tokenizer adds one."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from quantkit.errors import CalibrationError
from quantkit.inputs.calibration import calibration_windows, eval_windows, load_texts
from quantkit.inputs.special_tokens import tokenizer_bos, window_bos
from quantkit.inputs.specs import CalibrationSpec, EvalSpec, TextSource
from quantkit.inputs.tokens import hash_ids


@pytest.fixture(scope="module")
def bos_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from quantkit.util.testing import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny-bos") / "tiny-bos", add_bos=True)


@pytest.fixture(scope="module")
def bos_tokenizer(bos_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bos_model)


@pytest.fixture(scope="module")
def plain_tokenizer(tiny_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def _eval_stream(tokenizer) -> list[int]:
    text = "\n\n".join(load_texts(TextSource(), "eval"))
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_the_rule_reads_the_tokenizer(bos_tokenizer, plain_tokenizer) -> None:
    assert bos_tokenizer("a")["input_ids"][0] == 0  # the template adds <|endoftext|>
    assert tokenizer_bos(bos_tokenizer) == 0
    assert plain_tokenizer.bos_token_id == 0 and tokenizer_bos(plain_tokenizer) is None
    assert window_bos(plain_tokenizer, True, "eval") == 0
    assert window_bos(bos_tokenizer, False, "eval") is None


def test_eval_windows_start_with_bos_and_keep_the_plain_targets(bos_tokenizer) -> None:
    seq_len = 32
    windows = eval_windows(EvalSpec(num_windows=4, seq_len=seq_len), bos_tokenizer)
    full = [0, *_eval_stream(bos_tokenizer)]
    assert windows.ids[:, 0].tolist() == [0, 0, 0, 0]
    for i, row in enumerate(windows.ids.tolist()):
        # llama-perplexity's rule: the chunk's first token is overwritten, the rest unchanged
        assert row[1:] == full[i * seq_len + 1 : (i + 1) * seq_len]
    assert windows.source["bos"] == 0 and windows.describe()["bos"] == 0


def test_a_tokenizer_without_bos_gives_the_plain_stream(plain_tokenizer) -> None:
    windows = eval_windows(EvalSpec(num_windows=3, seq_len=32), plain_tokenizer)
    assert windows.ids.reshape(-1).tolist() == _eval_stream(plain_tokenizer)[:96]
    assert windows.source["bos"] is None


def test_add_bos_overrides_the_tokenizer_and_changes_the_hash(plain_tokenizer, bos_tokenizer) -> None:
    plain = eval_windows(EvalSpec(num_windows=3, seq_len=32), plain_tokenizer)
    forced = eval_windows(EvalSpec(num_windows=3, seq_len=32, add_bos=True), plain_tokenizer)
    assert forced.ids[:, 0].tolist() == [0, 0, 0] and plain.ids[0, 0] != 0
    assert forced.hash != plain.hash
    off = eval_windows(EvalSpec(num_windows=3, seq_len=32, add_bos=False), bos_tokenizer)
    assert off.ids.reshape(-1).tolist() == _eval_stream(bos_tokenizer)[:96]


def test_calibration_windows_start_with_bos(bos_tokenizer, plain_tokenizer) -> None:
    spec = CalibrationSpec(num_samples=8, seq_len=64, seed=3)
    led = calibration_windows(spec, bos_tokenizer)
    assert led.ids[:, 0].tolist() == [0] * 8 and led.source["bos"] == 0
    plain = calibration_windows(spec, plain_tokenizer)
    assert plain.source["bos"] is None and (plain.ids[:, 0] != 0).any()


def test_add_bos_without_a_bos_token_is_a_calibration_error(plain_tokenizer) -> None:
    no_bos = copy.deepcopy(plain_tokenizer)
    no_bos.bos_token = None
    assert tokenizer_bos(no_bos) is None
    with pytest.raises(CalibrationError, match=r"eval\.add_bos is true") as caught:
        eval_windows(EvalSpec(num_windows=1, seq_len=32, add_bos=True), no_bos)
    assert "remove eval.add_bos" in caught.value.hint


def test_the_hash_records_the_rule() -> None:
    ids = np.arange(12).reshape(3, 4)
    assert hash_ids(ids, 0) != hash_ids(ids, None) != hash_ids(ids, 1)
    assert hash_ids(ids, 0) == hash_ids(ids.astype(np.int64), 0)


def test_lm_eval_contexts_follow_the_rule(bos_model: Path, tiny_model: Path) -> None:
    from quantkit.evals.lm_eval_runtime import RuntimeLM
    from quantkit.runtimes.base import RuntimeSettings
    from quantkit.runtimes.hf import HFRuntime

    settings = RuntimeSettings(device="cpu")
    for path, lead in ((bos_model, [0]), (tiny_model, [])):
        runtime = HFRuntime.load(path, settings)
        try:
            lm = RuntimeLM(runtime)
            context, continuation = lm._encode_pair("The law says", " that")
            assert runtime.adds_bos is bool(lead)
            assert context == lead + runtime.tokenize("The law says")
            assert continuation == runtime.tokenize("The law says that")[len(context) - len(lead) :]
        finally:
            runtime.close()
        name, args = HFRuntime.lm_eval_model(path, settings)
        assert name == "hf" and args["add_bos_token"] is bool(lead)
