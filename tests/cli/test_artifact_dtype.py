"""Unquantized tensors of an artifact keep the source checkpoint's dtype (#13)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from conftest import write_tiny_recipe

from quantkit.cli import main


def header_dtypes(folder: Path) -> dict[str, str]:
    """tensor name -> safetensors dtype over the folder's safetensors files."""
    dtypes: dict[str, str] = {}
    for path in folder.glob("*.safetensors"):
        with path.open("rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(size))
        dtypes |= {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}
    return dtypes


@pytest.fixture(scope="module")
def bf16_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("bf16") / "tiny-bf16"
    AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(out)
    return out


@pytest.mark.parametrize("source", ["bf16", "fp32"])
def test_unquantized_tensors_keep_the_source_dtype(
    source: str, bf16_model: Path, tiny_model: Path, tmp_path: Path, capsys
) -> None:
    model = bf16_model if source == "bf16" else tiny_model
    want = "BF16" if source == "bf16" else "F32"
    assert set(header_dtypes(model).values()) == {want}
    recipe = write_tiny_recipe(tmp_path, model)
    code = main(["quantize", str(recipe), "--out", str(tmp_path / "run"), "--format", "json"])
    assert code == 0, capsys.readouterr().err
    dtypes = header_dtypes(tmp_path / "run" / "artifact")
    assert dtypes["model.embed_tokens.weight"] == want
    assert dtypes["model.norm.weight"] == want
    assert dtypes["model.layers.0.input_layernorm.weight"] == want
    assert dtypes["model.layers.0.self_attn.q_proj.weight"] == "F8_E4M3"  # quantized, compressed
    config = json.loads((tmp_path / "run" / "artifact" / "config.json").read_text())
    assert config["dtype"] == ("bfloat16" if source == "bf16" else "float32")
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["baseline"]["dtype"] == "float32"  # the baseline still computes in fp32 on the CPU


def test_run_and_cache_files_are_readable_as_the_umask_says(
    tiny_model: Path, tmp_path: Path, isolated_cache: Path, capsys
) -> None:
    """transformers writes safetensors through 0600 temporary files, and the reference cache
    used one too: every file of a run and of the reference cache is 0644 under umask 022."""
    import os

    old = os.umask(0o022)
    try:
        recipe = write_tiny_recipe(tmp_path, tiny_model)
        assert main(["quantize", str(recipe), "--out", str(tmp_path / "run"), "--format", "json"]) == 0
        capsys.readouterr()
    finally:
        os.umask(old)
    modes = {
        f"{root.name}/{path.relative_to(root)}": oct(path.stat().st_mode & 0o777)
        for root in (tmp_path / "run", isolated_cache / "references")
        for path in [root, *root.rglob("*")]
    }
    wrong = {name: mode for name, mode in modes.items() if mode not in ("0o644", "0o755")}
    assert "run/artifact/model.safetensors" in modes and any(".npz" in name for name in modes)
    assert not wrong, wrong
