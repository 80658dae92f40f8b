from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from quantkit.errors import CalibrationError
from quantkit.inputs.calibration import calibration_windows, eval_windows, hash_ids, load_texts
from quantkit.inputs.specs import CalibrationSpec, EvalSpec, TextSource


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def test_builtin_calibration_and_eval_parts_are_disjoint() -> None:
    calib = set(load_texts(TextSource(), "calibration"))
    held_out = set(load_texts(TextSource(), "eval"))
    assert len(calib) > 200 and len(held_out) > 40
    assert not calib & held_out


def test_calibration_windows_are_seeded(tokenizer) -> None:
    spec = CalibrationSpec(num_samples=8, seq_len=64, seed=1)
    first = calibration_windows(spec, tokenizer)
    again = calibration_windows(spec, tokenizer)
    other = calibration_windows(spec.model_copy(update={"seed": 2}), tokenizer)
    assert first.ids.shape == (8, 64)
    assert first.hash == again.hash and np.array_equal(first.ids, again.ids)
    assert other.hash != first.hash
    assert first.describe()["seed"] == 1 and first.describe()["tokens"] == 512


def test_eval_windows_are_the_first_consecutive_windows(tokenizer) -> None:
    windows = eval_windows(EvalSpec(num_windows=3, seq_len=32), tokenizer)
    stream = tokenizer("\n\n".join(load_texts(TextSource(), "eval")), add_special_tokens=False)["input_ids"]
    assert windows.ids.reshape(-1).tolist() == stream[:96]


def test_hash_depends_on_content_and_shape() -> None:
    ids = np.arange(12)
    assert hash_ids(ids.reshape(3, 4)) != hash_ids(ids.reshape(4, 3))
    assert hash_ids(ids.reshape(3, 4)) == hash_ids(ids.reshape(3, 4).astype(np.int64))


def test_local_jsonl_and_txt(tmp_path: Path, tokenizer) -> None:
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text(
        "\n".join(json.dumps({"content": f"line {i} " * 40}) for i in range(20)), encoding="utf-8"
    )
    spec = CalibrationSpec(source=str(jsonl), text_field="content", num_samples=2, seq_len=32)
    assert calibration_windows(spec, tokenizer).ids.shape == (2, 32)
    txt = tmp_path / "data.txt"
    txt.write_text("some words here " * 200, encoding="utf-8")
    assert eval_windows(EvalSpec(source=str(txt), num_windows=2, seq_len=16), tokenizer).ids.shape == (2, 16)


def test_hf_datasets_builder_with_local_files(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"doc {i}"}) for i in range(5)), encoding="utf-8")
    # 'json' is a datasets builder; data_files are found through the subset-less call below
    import datasets

    loaded = datasets.load_dataset("json", data_files=str(data), split="train")
    assert loaded.num_rows == 5
    folder_source = TextSource(source=f"hf:{tmp_path}", split="train")
    assert load_texts(folder_source, "calibration") == [f"doc {i}" for i in range(5)]


def test_hf_dataset_missing_column(tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").write_text(json.dumps({"body": "x"}) + "\n", encoding="utf-8")
    with pytest.raises(CalibrationError, match="no column 'text'"):
        load_texts(TextSource(source=f"hf:{tmp_path}"), "calibration")


def test_hf_dataset_unreachable_is_a_clear_error() -> None:
    with pytest.raises(CalibrationError, match="cannot load dataset"):
        load_texts(TextSource(source="hf:no-such-org/no-such-dataset"), "calibration")


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.txt"
    path.write_text("  \n", encoding="utf-8")
    with pytest.raises(CalibrationError, match="empty"):
        load_texts(TextSource(source=str(path)), "calibration")


def test_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(b"hello \xff\xfe world")
    with pytest.raises(CalibrationError, match="not valid UTF-8"):
        load_texts(TextSource(source=str(path)), "calibration")


def test_jsonl_without_the_text_field(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"body": "x"}) + "\n", encoding="utf-8")
    with pytest.raises(CalibrationError, match=r"x.jsonl:1: no 'text' field"):
        load_texts(TextSource(source=str(path)), "calibration")


def test_text_shorter_than_one_window(tmp_path: Path, tokenizer) -> None:
    path = tmp_path / "short.txt"
    path.write_text("just a few words", encoding="utf-8")
    with pytest.raises(CalibrationError, match="shorter than one window"):
        calibration_windows(CalibrationSpec(source=str(path), seq_len=256), tokenizer)


def test_too_few_windows(tmp_path: Path, tokenizer) -> None:
    path = tmp_path / "some.txt"
    path.write_text("word " * 300, encoding="utf-8")
    with pytest.raises(CalibrationError, match="wanted"):
        calibration_windows(CalibrationSpec(source=str(path), num_samples=100, seq_len=64), tokenizer)


def test_unsupported_extension(tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_text("a,b\n", encoding="utf-8")
    with pytest.raises(CalibrationError, match="unsupported"):
        load_texts(TextSource(source=str(path)), "calibration")


def test_chat_template_wraps_each_document(tokenizer) -> None:
    import copy

    chat = copy.deepcopy(tokenizer)
    chat.chat_template = "{% for m in messages %}<|user|>{{ m['content'] }}<|end|>{% endfor %}"
    plain = calibration_windows(CalibrationSpec(num_samples=40, seq_len=64), chat)
    wrapped = calibration_windows(CalibrationSpec(num_samples=40, seq_len=64, chat_template=True), chat)
    assert wrapped.hash != plain.hash
    assert "<|user|>" in chat.decode(wrapped.ids.reshape(-1).tolist())
    assert "<|user|>" not in chat.decode(plain.ids.reshape(-1).tolist())
    assert wrapped.describe()["chat_template"] is True


def test_chat_template_without_one_is_refused(tokenizer) -> None:
    with pytest.raises(CalibrationError, match="no chat template"):
        calibration_windows(CalibrationSpec(num_samples=1, seq_len=32, chat_template=True), tokenizer)
