"""HF -> GGUF conversion with llama.cpp's own converter, from the llama-cpp-python sdist.

The converter (``convert_hf_to_gguf.py`` + ``conversion/`` + its in-tree ``gguf-py``) ships
inside the llama-cpp-python source distribution but not in its wheel. quantkit downloads the
sdist of the *installed* llama-cpp-python version (same llama.cpp commit as the bindings) and
extracts just those parts into the user cache, once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from quantkit.errors import BackendError, MissingDependencyError, ModelSourceError
from quantkit.paths import cache_dir

PACKAGE = "llama-cpp-python"
_WELL_KNOWN = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Phi3ForCausalLM",
    "GPT2LMHeadModel",
)
_KEEP = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "LICENSE")


def bindings_version() -> str:
    """The installed llama-cpp-python version (the converter must match it)."""
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        raise MissingDependencyError(
            "llama-cpp-python is not installed (needed for GGUF)",
            "pip install 'quantkit[gguf]' (it builds llama.cpp, ~12 min on 2 cores)",
        ) from None


def download_sdist(into: Path, purpose: str, hint: str) -> Path:
    """The installed llama-cpp-python version's sdist, downloaded into ``into`` (for ``purpose``)."""
    version = bindings_version()
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
    result = subprocess.run(
        [*command, f"{PACKAGE}=={version}", "-d", str(into)], capture_output=True, text=True
    )
    archives = list(into.glob("*.tar.gz"))
    if result.returncode != 0 or not archives:
        last = (result.stderr.strip().splitlines() or ["no sdist downloaded"])[-1]
        raise BackendError(f"cannot download the {PACKAGE} {version} sdist for {purpose}: {last}", hint)
    return archives[0]


def converter_dir() -> Path:
    """Where the converter lives: ``QUANTKIT_LLAMA_CPP_CONVERTER`` or the user cache."""
    env = os.environ.get("QUANTKIT_LLAMA_CPP_CONVERTER")
    if env:
        return Path(env).expanduser()
    return cache_dir() / "llama.cpp" / f"convert-{bindings_version()}"


def ensure_converter(log: Callable[[str], None] = lambda message: None) -> Path:
    """The converter folder, downloading and extracting the matching sdist the first time."""
    target = converter_dir()
    if (target / "convert_hf_to_gguf.py").is_file():
        return target
    from quantkit.util.fileio import cache_entry_lock

    with cache_entry_lock(target):  # another process may be fetching it: wait, then reuse
        if (target / "convert_hf_to_gguf.py").is_file():
            return target
        version = bindings_version()
        log(f"fetching llama.cpp's converter from the {PACKAGE} {version} sdist")
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            sdist = download_sdist(
                Path(tmp),
                "the GGUF converter",
                "go online once, or set QUANTKIT_LLAMA_CPP_CONVERTER to an extracted llama.cpp folder",
            )
            staging = Path(tmp) / "convert"
            with tarfile.open(sdist) as archive:
                for member in archive.getmembers():
                    parts = member.name.split("/vendor/llama.cpp/", 1)
                    if len(parts) != 2 or not parts[1].startswith(_KEEP) or not member.isfile():
                        continue
                    destination = staging / parts[1]
                    destination.parent.mkdir(parents=True, exist_ok=True)
                    source = archive.extractfile(member)
                    if source is not None:
                        destination.write_bytes(source.read())
            if not (staging / "convert_hf_to_gguf.py").is_file():
                missing = f"the {PACKAGE} {version} sdist has no convert_hf_to_gguf.py"
                raise BackendError(missing, "report this")
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging, target)
    return target


def _run(converter: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(converter / "gguf-py"), str(converter)])}
    env.pop("NO_LOCAL_GGUF", None)
    return subprocess.run(
        [sys.executable, str(converter / "convert_hf_to_gguf.py"), *args],
        capture_output=True,
        text=True,
        env=env,
    )


def supported_architectures(converter: Path) -> list[str]:
    """HF architectures (e.g. LlamaForCausalLM) that this converter turns into text GGUFs."""
    cached = converter / "supported-architectures.json"
    if cached.is_file():
        return list(json.loads(cached.read_text()))
    result = _run(converter, ["--print-supported-models"])
    names: list[str] = []
    section = None
    for line in (result.stdout + result.stderr).splitlines():
        text = line.split(":", 2)[-1].strip() if "models:" not in line else line.strip()
        if text.endswith("models:"):
            section = text.split()[-2] if len(text.split()) > 1 else text
            continue
        if section == "TEXT" and text.startswith("- "):
            names.append(text[2:].strip())
    if not names:
        raise BackendError("could not list the converter's supported architectures", "rerun with --verbose")
    cached.write_text(json.dumps(sorted(names)))
    return sorted(names)


def check_architecture(architecture: str, converter: Path) -> None:
    """Refuse an architecture the converter cannot handle, naming the ones it can."""
    supported = supported_architectures(converter)
    if architecture not in supported:
        common = [name for name in _WELL_KNOWN if name in supported]
        raise ModelSourceError(
            f"llama.cpp's converter does not support architecture '{architecture}'",
            f"supported include {', '.join(common)}, ... ({len(supported)} in all; the list is "
            f"{converter / 'supported-architectures.json'})",
        )


def convert(model_dir: Path, out_file: Path, outtype: str, converter: Path) -> None:
    """Convert an HF folder to a GGUF file (``outtype``: f16, bf16 or f32)."""
    result = _run(converter, [str(model_dir), "--outfile", str(out_file), "--outtype", outtype])
    if result.returncode != 0 or not out_file.is_file():
        lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
        raise BackendError(
            f"GGUF conversion failed: {lines[-1] if lines else 'no output'}",
            "rerun with --verbose; the converter's log is in the error above",
        )
