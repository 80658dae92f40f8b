"""Artifacts quantkit did not make: a GGUF file, an HF folder (plain, compressed-tensors,
GPTQ, AWQ, FP8) or another quantkit run, recognised from its own metadata.

``inspect_external`` says what a path holds (format, runtime, scheme, bits, metadata);
``import_external`` puts it into a run's artifact folder (hard links where the file system
allows, else copies: the user's files are only read); ``check_vocabulary`` refuses an
artifact whose tokenizer gives the baseline's token ids other meanings.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import JsonValue

from quantkit.errors import ArtifactError, MissingDependencyError, UserInputError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

SourceKind = Literal["gguf", "hf", "run"]
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
_WHAT = "a GGUF file, a Hugging Face model folder or a quantkit run folder"
# quant_method -> the libraries transformers needs to load it (besides torch)
_LOADERS = {
    "gptq": ("optimum", "gptqmodel"),
    "awq": ("gptqmodel", "accelerate"),
}


@dataclass(frozen=True)
class ExternalArtifact:
    """What an external path holds and how quantkit runs it."""

    kind: SourceKind
    path: Path  # the GGUF file, the HF folder, or the run's artifact folder
    format: str  # gguf | safetensors | compressed-tensors | gptq | awq | fp8 | ...
    runtime: str  # the RUNTIMES name that scores it
    scheme: str
    weight_bits: float | None  # nominal bits per quantized weight; None: measured from the file
    files: tuple[Path, ...]  # what is imported into the run
    metadata: dict[str, JsonValue] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The run's default display name."""
        return self.path.name if self.kind != "run" else self.path.parent.name


def display_names(artifacts: Sequence[ExternalArtifact]) -> list[str]:
    """Each artifact's display name, made unique: ``name``, and where several share it (three
    ``model.gguf``), as few of the folders above it as tell them apart (``a/model.gguf``); the
    same path given twice gets a number (``#2``)."""
    names = [artifact.name for artifact in artifacts]
    for name in set(names):
        group = [i for i, other in enumerate(names) if other == name]
        if len(group) < 2:
            continue
        paths = [_shown_path(artifacts[i]) for i in group]
        for depth in range(1, max(len(path.parts) for path in paths)):
            deeper = ["/".join(path.parts[-(depth + 1) :]) for path in paths]
            if len(set(deeper)) == len(set(paths)):
                break
        for i, label in zip(group, deeper, strict=True):
            names[i] = label
    shared = {name for name in names if names.count(name) > 1}
    counts: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in shared:
            counts[name] = counts.get(name, 0) + 1
            names[i] = f"{name}#{counts[name]}"
    return names


def _shown_path(artifact: ExternalArtifact) -> Path:
    return (artifact.path if artifact.kind != "run" else artifact.path.parent).resolve()


def inspect_external(path: Path) -> ExternalArtifact:
    """Recognise ``path``; anything else is a one-line error saying what is accepted."""
    path = path.expanduser()
    if not path.exists():
        raise UserInputError(f"artifact '{path}' not found", f"give {_WHAT}")
    if path.is_file():
        return _inspect_gguf(path)
    if (path / "manifest.json").is_file() and (path / "artifact").is_dir():
        return _inspect_run(path)
    if (path / "config.json").is_file():
        return _inspect_hf(path)
    ggufs = [p for p in sorted(path.glob("*.gguf")) if p.name != "imatrix.gguf"]
    if len(ggufs) == 1 or (ggufs and _SPLIT.match(ggufs[0].name)):
        return _inspect_gguf(ggufs[0])
    if len(ggufs) > 1:
        raise UserInputError(
            f"'{path}' holds {len(ggufs)} GGUF files", "give the one to evaluate: " + ggufs[0].name
        )
    raise UserInputError(f"'{path}' is not {_WHAT}", "give a .gguf file, or a folder with config.json")


def _split_files(first: Path) -> tuple[Path, ...]:
    """All parts of a split GGUF (``x-00001-of-00003.gguf``), or the file itself."""
    match = _SPLIT.match(first.name)
    if match is None:
        return (first,)
    if int(match["index"]) != 1:
        raise UserInputError(f"'{first}' is part {int(match['index'])} of a split GGUF", "give part 00001")
    count = int(match["count"])
    names = [f"{match['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
    parts = tuple(first.with_name(name) for name in names)
    missing = [part.name for part in parts if not part.is_file()]
    if missing:
        raise ArtifactError(f"split GGUF '{first.name}' is missing {', '.join(missing)}", "copy all parts")
    return parts


def _inspect_gguf(path: Path) -> ExternalArtifact:
    from quantkit.runtimes.llamacpp import check_gguf

    hint = f"give {_WHAT}; a damaged GGUF must be copied or downloaded again"
    files = _split_files(path)
    header = check_gguf(path, hint)
    from quantkit.llamacpp.gguf_scheme import gguf_scheme

    def value(key: str) -> JsonValue:
        contents = header.value(key)
        return contents if isinstance(contents, (str, int, float, bool)) else None

    scheme = gguf_scheme(path)
    metadata: dict[str, JsonValue] = {
        key.removeprefix("general."): value(key)
        for key in ("general.architecture", "general.name", "general.file_type", "general.quantized_by")
        if value(key) is not None
    }
    metadata["split_count"] = len(files)
    metadata["type_shares_pct"] = dict(scheme.shares)
    return ExternalArtifact(
        kind="gguf",
        path=path,
        format="gguf",
        runtime="llamacpp",
        scheme=scheme.label,
        weight_bits=None,  # measured from the file, as for quantkit's own GGUFs
        files=files,
        metadata=metadata,
    )


def _inspect_run(path: Path) -> ExternalArtifact:
    from quantkit.results.store import load_run

    record = load_run(path)
    info = record.manifest.artifact
    folder = path / info.path
    return ExternalArtifact(
        kind="run",
        path=folder,
        format=info.format,
        runtime=info.runtime,
        scheme=info.scheme,
        weight_bits=info.weight_bits,
        files=tuple(sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "quantkit-recipe.yaml")),
        metadata={
            "run_id": record.manifest.run_id,
            "run": str(path.resolve()),
            "name": record.manifest.display_name,
            "method": record.manifest.recipe.method,
            "model": record.manifest.model.spec,
        },
    )


def _quantization_scheme(config: dict[str, JsonValue]) -> tuple[str, str, float | None]:
    """(format, scheme, nominal bits) from config.json's ``quantization_config``."""
    raw = config.get("quantization_config")
    if not isinstance(raw, dict):
        dtype = config.get("torch_dtype") or config.get("dtype") or "float32"
        bits = {"float32": 32.0, "float16": 16.0, "bfloat16": 16.0}.get(str(dtype))
        return "safetensors", str(dtype), bits
    method = str(raw.get("quant_method", "unknown"))
    if method == "compressed-tensors":
        return "compressed-tensors", *_compressed_tensors_scheme(raw)
    bits_value = raw.get("bits") or raw.get("w_bit")
    group_value = raw.get("group_size") or raw.get("q_group_size")
    if isinstance(bits_value, int):
        group = group_value if isinstance(group_value, int) and group_value > 0 else None
        scheme = f"{method.upper()} W{bits_value}" + (f" g{group}" if group else "")
        return method, scheme, bits_value + (16 / group if group else 0.0)
    if method == "fp8":
        return "fp8", "FP8", 8.0
    return method, method, None


def _compressed_tensors_scheme(raw: dict[str, JsonValue]) -> tuple[str, float | None]:
    """The scheme in quantkit's own names (``W4A16-g128``, ``FP8_DYNAMIC``...) and its bits."""
    groups = raw.get("config_groups")
    first = next(iter(groups.values()), None) if isinstance(groups, dict) and groups else None
    weights = first.get("weights") if isinstance(first, dict) else None
    if not isinstance(first, dict) or not isinstance(weights, dict):
        return "compressed-tensors", None
    bits = weights.get("num_bits")
    if not isinstance(bits, int):
        return "compressed-tensors", None
    activations = first.get("input_activations")
    act = activations if isinstance(activations, dict) else {}
    if weights.get("type") == "float":
        if not act:
            return f"FP{bits}-weight-only", float(bits)
        if weights.get("block_structure"):
            return f"FP{bits}_BLOCK", float(bits)
        return f"FP{bits}_DYNAMIC" if act.get("dynamic") else f"FP{bits}", float(bits)
    group = weights.get("group_size")
    grouped = isinstance(group, int) and group > 0
    symmetric = weights.get("symmetric", True) is not False
    act_bits = act.get("num_bits") if isinstance(act.get("num_bits"), int) else 16
    layout = f"g{group}" if grouped else "per-channel"
    scheme = f"W{bits}A{act_bits}-{layout}{'' if symmetric else '-asym'}"
    overhead = (16 + (0 if symmetric else bits)) / group if grouped and isinstance(group, int) else 0.0
    return scheme, bits + overhead


def _inspect_hf(path: Path) -> ExternalArtifact:
    from quantkit.inputs.models import check_causal_lm, read_config, weight_files

    check_causal_lm(path, trust_remote_code=False)
    config = read_config(path)
    weights = weight_files(path)
    if not weights:
        raise ArtifactError(f"'{path}' has a config.json but no weight files", "copy the whole model folder")
    fmt, scheme, bits = _quantization_scheme(config)
    missing = [name for name in _LOADERS.get(fmt, ()) if not _installed(name)]
    if missing:
        raise MissingDependencyError(
            f"'{path}' is a {fmt.upper()} checkpoint; transformers loads it only with {', '.join(missing)}",
            f"pip install {' '.join(missing)} (or convert it to compressed-tensors with llm-compressor)",
        )
    raw = config.get("quantization_config")
    metadata: dict[str, JsonValue] = {
        "architecture": (config.get("architectures") or [config.get("model_type")])[0],
        "quantization_config": raw if isinstance(raw, dict) else None,
    }
    files = tuple(sorted(p for p in path.iterdir() if p.is_file()))
    return ExternalArtifact("hf", path, fmt, "hf", scheme, bits, files, metadata)


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def import_external(artifact: ExternalArtifact, out_dir: Path) -> str:
    """Hard-link (or copy) the artifact's files into ``out_dir``; returns "hardlink" or "copy"."""
    out_dir.mkdir(parents=True, exist_ok=True)
    how = "hardlink"
    root = artifact.path if artifact.path.is_dir() else artifact.path.parent
    for source in artifact.files:
        target = out_dir / source.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError:  # another file system, or links refused: copy
            shutil.copyfile(source, target)
            how = "copy"
    return how


def provenance(artifact: ExternalArtifact) -> dict[str, JsonValue]:
    """Where the artifact came from: path, size, sha256 of each file, and its own metadata."""
    from quantkit.util.fileio import file_sha256

    root = artifact.path if artifact.path.is_dir() else artifact.path.parent
    hashes: dict[str, JsonValue] = {str(p.relative_to(root)): file_sha256(p) for p in artifact.files}
    return {
        "kind": artifact.kind,
        "path": str(artifact.path.resolve()),
        "bytes": sum(p.stat().st_size for p in artifact.files),
        "sha256": hashes[artifact.path.name] if artifact.kind == "gguf" else None,
        "files": hashes,
        "metadata": json.loads(json.dumps(artifact.metadata)),
    }


def artifact_tokens(artifact: ExternalArtifact) -> list[str] | None:
    """The artifact's own token strings by id (None when it carries no tokenizer)."""
    if artifact.format == "gguf":
        from quantkit.llamacpp.gguf_file import read_gguf

        tokens = read_gguf(artifact.path).value("tokenizer.ggml.tokens")
        return None if tokens is None else [str(token) for token in tokens]
    folder = artifact.path
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return [str(token) for token in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))]


def check_vocabulary(
    artifact: ExternalArtifact, tokenizer: PreTrainedTokenizerBase, token_ids: Sequence[int]
) -> None:
    """Refuse an artifact that reads the baseline's token ids differently: every id in the
    evaluation windows must exist there and be the same token (added tokens excepted, whose
    text converters may normalise)."""
    theirs = artifact_tokens(artifact)
    if theirs is None:
        return
    added = set(tokenizer.get_added_vocab().values())
    ids = sorted(set(token_ids))
    ours = tokenizer.convert_ids_to_tokens(ids)
    for token_id, token in zip(ids, ours, strict=True):
        if token_id >= len(theirs):
            raise UserInputError(
                f"the artifact's vocabulary has {len(theirs)} tokens; the baseline's text uses id {token_id}",
                "evaluate an artifact of the same model (--baseline names its unquantized source)",
            )
        if token_id not in added and theirs[token_id] != token:
            raise UserInputError(
                f"the artifact's tokenizer differs from the baseline's: token {token_id} is "
                f"{theirs[token_id]!r} there and {token!r} in the baseline",
                "evaluate an artifact of the same model (--baseline names its unquantized source)",
            )
