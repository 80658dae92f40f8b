"""A GGUF file as a model source: dequantized once into an HF folder whose tokenizer gives
exactly llama.cpp's token ids.

transformers rebuilds a tokenizer from GGUF metadata, and gets some wrong: for SentencePiece
vocabularies (``tokenizer.ggml.model = llama``: Llama, Gemma) its rebuild splits words
differently from the GGUF's own model (Gemma 3: 27,928 tokens for text llama.cpp makes 15,752
of), and for byte-level BPE (``gpt2``) it drops pre-tokenizer rules such as SmolLM2's digits.
quantkit repairs both from the GGUF's own metadata — a SentencePiece ``tokenizer.model``
written from its pieces, scores and types; the byte-level pre-tokenizer and special ids — then
checks the result against llama.cpp on the built-in calibration and evaluation text and refuses
the model, showing the first differing tokens, when they still differ.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantkit.errors import ModelSourceError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from quantkit.llamacpp.gguf_file import GGUFFile

CONVERSION_VERSION = 2  # bump when the conversion's output changes (2: user-defined pieces declared)
_SPM_FILE = "tokenizer.model"


class GGUFMetadata:
    """The metadata fields of a GGUF file that the conversion needs (read once)."""

    def __init__(self, path: Path, header: GGUFFile | None = None) -> None:
        from quantkit.llamacpp.gguf_file import read_gguf

        self.path = path
        self.fields = (header or read_gguf(path)).fields

    def value(self, name: str) -> Any:
        return self.fields.get(name)

    @property
    def architecture(self) -> str:
        return str(self.value("general.architecture") or "")

    @property
    def tokenizer_model(self) -> str | None:
        model = self.value("tokenizer.ggml.model")
        return None if model is None else str(model)


def check_convertible(meta: GGUFMetadata) -> None:
    """Refuse, before any conversion, a GGUF transformers cannot load or that has no vocabulary."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    arch = meta.architecture
    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        supported = ", ".join(sorted(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general",)))
        raise ModelSourceError(
            f"'{meta.path}' is a GGUF of architecture '{arch}', which transformers cannot load",
            f"GGUF architectures transformers can load: {supported}; or give the model's HF folder",
        )
    if meta.tokenizer_model is None or meta.value("tokenizer.ggml.tokens") is None:
        raise ModelSourceError(
            f"'{meta.path}' has no tokenizer metadata (tokenizer.ggml.*)",
            "use a GGUF converted with its vocabulary, or give the model's HF folder",
        )


def storage_dtype(meta: GGUFMetadata) -> torch.dtype:
    """The GGUF's precision class: F32 -> float32, BF16 -> bfloat16, F16 and the block-quantized
    types (whose scales are fp16) -> float16."""
    import torch

    file_type = meta.value("general.file_type")
    return {0: torch.float32, 32: torch.bfloat16}.get(
        int(file_type) if file_type is not None else 1, torch.float16
    )


def write_sentencepiece_model(meta: GGUFMetadata, out: Path) -> None:
    """A SentencePiece BPE model (``tokenizer.model``) from the GGUF's pieces, scores and types;
    llama.cpp's SPM tokenizer implements the same score-ordered merges."""
    from sentencepiece import sentencepiece_model_pb2 as spm

    model = spm.ModelProto()  # type: ignore[attr-defined]
    trainer = model.trainer_spec
    trainer.model_type = spm.TrainerSpec.BPE  # type: ignore[attr-defined]
    tokens = meta.value("tokenizer.ggml.tokens")
    trainer.vocab_size = len(tokens)
    trainer.byte_fallback = True
    for field, key in (("unk_id", "unknown"), ("bos_id", "bos"), ("eos_id", "eos"), ("pad_id", "padding")):
        token_id = meta.value(f"tokenizer.ggml.{key}_token_id")
        setattr(trainer, field, -1 if token_id is None else int(token_id))
    normalizer = model.normalizer_spec
    normalizer.name = "identity"
    add_prefix = meta.value("tokenizer.ggml.add_space_prefix")
    normalizer.add_dummy_prefix = True if add_prefix is None else bool(add_prefix)
    normalizer.remove_extra_whitespaces = False
    normalizer.escape_whitespaces = True
    scores = meta.value("tokenizer.ggml.scores") or [0.0] * len(tokens)
    types = meta.value("tokenizer.ggml.token_type") or [1] * len(tokens)
    for piece, score, kind in zip(tokens, scores, types, strict=True):
        entry = model.pieces.add()
        entry.piece, entry.score, entry.type = piece, float(score), int(kind)  # GGUF uses SPM's types
    out.write_bytes(model.SerializeToString())


_USER_DEFINED = 4  # SentencePiece's piece type, which GGUF's token_type uses


def declare_for_converter(meta: GGUFMetadata, config_file: Path) -> None:
    """Say in ``tokenizer_config.json`` what llama.cpp's converter reads there and nowhere else.

    The converter types a SentencePiece piece from ``tokenizer.model`` as normal, control,
    unused or byte; a user-defined piece (Gemma 3's whitespace runs and ``[multimodal]``,
    matched before any merge) it only learns from ``added_tokens_decoder`` entries that are not
    special, which transformers 5 no longer writes. Without them the GGUF it writes types those
    pieces normal and llama.cpp cuts text differently (Gemma 3: +18 % tokens on indented prose).
    The GGUF's ``add_bos_token``/``add_eos_token`` flags are written too, as the source says."""
    import json

    if meta.tokenizer_model != "llama":
        return  # byte-level BPE: the converter reads tokenizer.json, where added tokens are kept
    config = json.loads(config_file.read_text(encoding="utf-8"))
    tokens = meta.value("tokenizer.ggml.tokens") or []
    types = meta.value("tokenizer.ggml.token_type") or []
    decoder = dict(config.get("added_tokens_decoder") or {})
    for token_id, (piece, kind) in enumerate(zip(tokens, types, strict=True)):
        if int(kind) == _USER_DEFINED:
            decoder[str(token_id)] = {
                "content": str(piece),
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": False,
            }
    config["added_tokens_decoder"] = decoder
    for flag in ("add_bos_token", "add_eos_token"):
        value = meta.value(f"tokenizer.ggml.{flag}")
        if value is not None:
            config[flag] = bool(value)
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def repaired_tokenizer(meta: GGUFMetadata, folder: Path) -> PreTrainedTokenizerBase:
    """The GGUF's tokenizer as transformers rebuilds it, repaired from the metadata; files the
    repair needs (``tokenizer.model``) are written into ``folder``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(meta.path.parent, gguf_file=meta.path.name)
    if meta.tokenizer_model == "llama":
        spm_dir = Path(tempfile.mkdtemp(dir=folder, prefix=".spm."))
        try:
            write_sentencepiece_model(meta, spm_dir / _SPM_FILE)
            add_bos, add_eos = (
                meta.value("tokenizer.ggml.add_bos_token"),
                meta.value("tokenizer.ggml.add_eos_token"),
            )
            tokenizer = type(tokenizer).from_pretrained(
                spm_dir, add_bos_token=bool(add_bos), add_eos_token=bool(add_eos)
            )
            shutil.copy2(spm_dir / _SPM_FILE, folder / _SPM_FILE)  # llama.cpp's converter reads it
        finally:
            shutil.rmtree(spm_dir, ignore_errors=True)
    elif meta.tokenizer_model == "gpt2":
        _repair_byte_level(tokenizer, meta)
    for role, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("pad", "padding_token_id")):
        token_id = meta.value(f"tokenizer.ggml.{key}")
        if token_id is not None:
            setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(int(token_id)))
    return tokenizer


def _repair_byte_level(tokenizer: Any, meta: GGUFMetadata) -> None:
    """Undo what transformers' rebuild gets wrong for a byte-level BPE: it drops SmolLM2's digit
    pre-tokenizer and adds SentencePiece-style byte fallback and a '▁' decoder (so llama.cpp's
    converter would take it for a SentencePiece vocabulary)."""
    from tokenizers import decoders, pre_tokenizers

    backend = tokenizer.backend_tokenizer
    if meta.value("tokenizer.ggml.pre") == "smollm":
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
            ]
        )
    backend.model.byte_fallback = False
    backend.model.fuse_unk = False
    backend.decoder = decoders.ByteLevel()
    tokenizer.clean_up_tokenization_spaces = False  # destructive for byte-level BPE


def check_tokenizer(tokenizer: PreTrainedTokenizerBase, gguf_path: Path, texts: dict[str, str]) -> None:
    """Refuse a tokenizer whose ids differ from llama.cpp's on any of ``texts`` (name -> text),
    or whose BOS rule differs from the GGUF's ``add_bos_token``; the message shows where."""
    from quantkit.inputs.special_tokens import tokenizer_bos
    from quantkit.inputs.tokenizer_check import compare_ids, file_bos
    from quantkit.runtimes.llamacpp import LlamaCppVocabulary

    vocab = LlamaCppVocabulary.load(gguf_path)
    try:
        _, mismatch = compare_ids(tokenizer, vocab, texts)
        expected = file_bos(vocab)
    finally:
        vocab.close()
    if mismatch is not None:
        at, ours, theirs = mismatch.at, mismatch.ours, mismatch.theirs
        raise ModelSourceError(
            f"the tokenizer rebuilt from '{gguf_path.name}' differs from llama.cpp's on the {mismatch.text} "
            f"text at token {at}: {_pieces(tokenizer, ours[at : at + 4])} vs "
            f"{_pieces(tokenizer, theirs[at : at + 4])} ({len(ours)} vs {len(theirs)} tokens)",
            "give the model's HF folder (with its own tokenizer) instead of the GGUF",
        )
    if tokenizer_bos(tokenizer) != expected:
        raise ModelSourceError(
            f"the tokenizer rebuilt from '{gguf_path.name}' adds BOS {tokenizer_bos(tokenizer)}, "
            f"the GGUF says {expected}",
            "give the model's HF folder (with its own tokenizer) instead of the GGUF",
        )


def _pieces(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    return repr(tokenizer.convert_ids_to_tokens(ids))


_DAMAGED_SOURCE_HINT = "give a whole .gguf file (a truncated download fails here)"


def convert_gguf(
    gguf_path: Path, target: Path, dtype: torch.dtype | None = None, damaged_hint: str = _DAMAGED_SOURCE_HINT
) -> Path:
    """Dequantize ``gguf_path`` into the HF folder ``target`` (built in a temporary sibling and
    moved into place only when complete; nothing is left behind on failure). A damaged file
    is refused first, with ``damaged_hint``."""
    from transformers import AutoTokenizer

    from quantkit.inputs.calibration import builtin_texts
    from quantkit.inputs.tokenizer_check import stress_text
    from quantkit.runtimes.llamacpp import check_gguf
    from quantkit.util.fileio import share_modes

    meta = GGUFMetadata(gguf_path, check_gguf(gguf_path, damaged_hint))
    check_convertible(meta)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        with _one_gguf_parse():
            tokenizer = repaired_tokenizer(meta, tmp)
            check_tokenizer(tokenizer, gguf_path, builtin_texts())
            _save_model(meta, tmp, dtype or storage_dtype(meta))
        tokenizer.save_pretrained(tmp)
        declare_for_converter(meta, tmp / "tokenizer_config.json")
        saved = AutoTokenizer.from_pretrained(tmp)  # what every run reads: checked as saved
        check_tokenizer(saved, gguf_path, {"stress": stress_text(saved)})
        share_modes(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


@contextmanager
def _one_gguf_parse() -> Iterator[None]:
    """transformers parses the GGUF with gguf-py's GGUFReader for the config, the tokenizer and
    the weights, each time anew (four parses: 9 s each on Gemma 3's 262k vocabulary). Within a
    conversion they share one parse per file; the reader only maps the file read-only."""
    import gguf

    original = gguf.GGUFReader
    parsed: dict[tuple[str, str], Any] = {}

    def shared(path: Any, mode: str = "r") -> Any:
        key = (str(path), mode)
        if key not in parsed:
            parsed[key] = original(path, mode)  # type: ignore[arg-type]
        return parsed[key]

    gguf.GGUFReader = shared  # type: ignore[misc,assignment]  # transformers imports it per call
    try:
        yield
    finally:
        gguf.GGUFReader = original  # type: ignore[misc]


def _save_model(meta: GGUFMetadata, out: Path, dtype: torch.dtype) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(meta.path.parent, gguf_file=meta.path.name, dtype=dtype)
    # transformers keeps the GGUF quantizer attached and refuses to save; the weights are
    # already dequantized, so drop it and save a plain checkpoint.
    setattr(model, "hf_quantizer", None)  # noqa: B010 - typed as a module attribute
    setattr(model, "is_quantized", False)  # noqa: B010
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
