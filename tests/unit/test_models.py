from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from quantkit.errors import ModelSourceError
from quantkit.inputs.models import fingerprint, resolve_model


def test_local_folder(tiny_model: Path) -> None:
    source = resolve_model(str(tiny_model))
    assert source.kind == "local"
    assert source.architecture == "LlamaForCausalLM"
    assert source.path == tiny_model.resolve()
    assert source.disk_bytes() > 0


def test_missing_path() -> None:
    with pytest.raises(ModelSourceError, match="not found"):
        resolve_model("./no/such/model")


def test_file_instead_of_folder(tmp_path: Path) -> None:
    weights = tmp_path / "m.bin"
    weights.write_bytes(b"weights")
    with pytest.raises(ModelSourceError, match="is a file, not a model folder") as err:
        resolve_model(str(weights))
    assert ".gguf file" in err.value.hint


def test_a_gguf_that_is_only_a_header_is_damaged(tmp_path: Path) -> None:
    from quantkit.errors import ArtifactError

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")  # a GGUF is a model source now: this one is cut short
    with pytest.raises(ArtifactError, match="is truncated or damaged"):
        resolve_model(str(gguf))


def test_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match=r"no config\.json"):
        resolve_model(str(tmp_path))


def test_folder_that_is_not_a_causal_lm(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"]}), encoding="utf-8"
    )
    with pytest.raises(ModelSourceError, match="not a causal language model"):
        resolve_model(str(tmp_path))


def test_folder_of_an_unknown_model_type(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit"}), encoding="utf-8")
    with pytest.raises(ModelSourceError, match="not a causal language model"):
        resolve_model(str(tmp_path))


def test_remote_code_is_refused_without_the_flag(tmp_path: Path, tiny_model: Path) -> None:
    folder = tmp_path / "custom"
    shutil.copytree(tiny_model, folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(ModelSourceError, match="trust_remote_code") as err:
        resolve_model(str(folder))
    assert "--trust-remote-code" in err.value.hint
    assert resolve_model(str(folder), trust_remote_code=True).kind == "local"


def test_hub_id_offline_gives_a_clear_error() -> None:
    with pytest.raises(ModelSourceError, match="cannot download 'someorg/some-model'"):
        resolve_model("someorg/some-model")


def test_hub_id_is_resolved_from_the_local_hub_cache(tmp_path: Path, tiny_model: Path, monkeypatch) -> None:
    """The real snapshot_download code path, served from a hub cache laid out on disk."""
    hub = tmp_path / "hub"
    repo = hub / "models--someorg--tiny"
    snapshot = repo / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(tiny_model, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123456789abcdef0123456789abcdef01234567")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    source = resolve_model("someorg/tiny")
    assert source.kind == "hub"
    assert source.path == snapshot


def test_fingerprint_follows_the_weights(tmp_path: Path, tiny_model: Path) -> None:
    folder = tmp_path / "copy"
    shutil.copytree(tiny_model, folder)
    first = fingerprint(folder)
    assert fingerprint(folder) == first == fingerprint(tiny_model)
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert fingerprint(folder) != first


def test_folder_without_a_tokenizer(tmp_path: Path, tiny_model: Path) -> None:
    folder = tmp_path / "bare"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_model / name, folder / name)
    with pytest.raises(ModelSourceError, match="has no tokenizer"):
        resolve_model(str(folder))


def test_fingerprint_follows_the_tokenizer(tmp_path: Path, tiny_model: Path) -> None:
    folder = tmp_path / "copy"
    shutil.copytree(tiny_model, folder)
    first = fingerprint(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["eos_token"] = "<|im_end|>"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert fingerprint(folder) != first
