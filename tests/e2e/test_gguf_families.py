"""Other llama.cpp families through the same path: tiny random Mistral and Qwen3 models.

They borrow SmolLM2's byte-level BPE tokenizer (a real one that llama.cpp's converter
recognises); Qwen2 and Gemma need their own tokenizers (a Qwen2 pre-tokenizer hash, a
SentencePiece tokenizer.model), which no offline package ships.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import require_extra

from quantkit.cli import main

pytestmark = pytest.mark.slow
require_extra("llama_cpp", "gguf")


@pytest.fixture(scope="module")
def smollm2_tokenizer(session_cache: Path) -> Path:
    os.environ["QUANTKIT_CACHE"] = str(session_cache)
    from quantkit.inputs.models import resolve_model

    return resolve_model("smollm2-135m").path


def tiny_family(family: str, tokenizer_dir: Path, out: Path) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        family, vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).to(torch.float32)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tokenizer_dir / name, out / name)
    return out


@pytest.mark.parametrize(
    ("family", "architecture"), [("mistral", "MistralForCausalLM"), ("qwen3", "Qwen3ForCausalLM")]
)
def test_family_converts_and_matches_in_llama_cpp(
    family: str, architecture: str, smollm2_tokenizer: Path, tmp_path: Path
) -> None:
    model = tiny_family(family, smollm2_tokenizer, tmp_path / family)
    budget = ["--set", "eval.num_windows=2", "--set", "eval.seq_len=128", "--device", "cpu"]
    runs = {}
    for kind in ("F16", "Q8_0"):
        out = tmp_path / f"run-{kind}"
        args = [
            "quantize",
            "gguf-q8_0",
            "--model",
            str(model),
            "--out",
            str(out),
            "--set",
            f"options.type={kind}",
        ]
        assert main(args + budget) == 0  # F16 and Q8_0 both pass the recipe gate (max_kld_mean 0.01)
        runs[kind] = json.loads((out / "manifest.json").read_text())
    f16 = runs["F16"]["metrics"]["quantized"]
    assert runs["F16"]["model"]["architecture"] == architecture
    assert f16["kld_mean"]["value"] < 1e-4 and f16["top1_agreement_pct"]["value"] > 99
    assert runs["Q8_0"]["metrics"]["quantized"]["kld_mean"]["value"] > f16["kld_mean"]["value"]
