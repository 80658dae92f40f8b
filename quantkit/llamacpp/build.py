"""llama.cpp's own tools (``llama-server``, ``llama-perplexity``) built from the sdist of the
installed llama-cpp-python: the same llama.cpp commit as the bindings quantkit evaluates with.

A build takes minutes on two cores (portable flags, static libraries), so it happens once per
tool and bindings version and the binary is kept in the user cache. Users who already have
llama.cpp installed do not need it: ``quantkit serve --server llama-server`` looks on PATH first.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from quantkit.errors import BackendError, MissingDependencyError
from quantkit.llamacpp.convert import PACKAGE, bindings_version, download_sdist
from quantkit.paths import cache_dir

TOOLS = ("llama-server", "llama-perplexity")
_FLAGS = (
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_CURL=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DCMAKE_BUILD_TYPE=Release",
)


def cached_tool(tool: str) -> Path:
    """Where the built ``tool`` of the installed bindings' llama.cpp is kept (it may not exist)."""
    short = tool.removeprefix("llama-")
    return cache_dir() / "llama.cpp" / f"{short}-{bindings_version()}" / tool


def build_tool(tool: str, jobs: int = 2, log: Callable[[str], None] = lambda message: None) -> Path:
    """The cached ``tool``, built from the matching llama-cpp-python sdist on first use."""
    if tool not in TOOLS:
        raise ValueError(f"unknown llama.cpp tool {tool!r}")
    binary = cached_tool(tool)
    if binary.is_file():
        return binary
    cmake = shutil.which("cmake") or str(Path(sys.executable).parent / "cmake")
    if not Path(cmake).is_file():
        raise MissingDependencyError(
            f"building {tool} needs cmake", "pip install cmake (or apt install cmake)"
        )
    from quantkit.util.fileio import cache_entry_lock

    with cache_entry_lock(binary):  # another process may be building it: wait, then reuse
        if binary.is_file():
            return binary
        version = bindings_version()
        binary.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=binary.parent.parent) as tmp:
            log(f"building {tool} from the {PACKAGE} {version} sdist (a few minutes, once)")
            source = _extract_sources(Path(tmp))
            build = source / "build"
            server = "-DLLAMA_BUILD_SERVER=" + ("ON" if tool == "llama-server" else "OFF")
            configure = [cmake, "-S", str(source), "-B", str(build), *_FLAGS, server]
            _run(configure, tool)
            _run([cmake, "--build", str(build), "--target", tool, "-j", str(jobs)], tool)
            partial = binary.with_suffix(".partial")
            shutil.copy2(build / "bin" / tool, partial)
            os.replace(partial, binary)
    return binary


def _extract_sources(into: Path) -> Path:
    """llama.cpp's sources (``vendor/llama.cpp``) from the bindings' sdist, extracted under ``into``."""
    sdist = download_sdist(
        into, "building llama.cpp", "go online once, or install llama.cpp yourself and put its tools on PATH"
    )
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if "/vendor/llama.cpp/" in m.name]
        archive.extractall(into, members=members, filter="data")
    return next(into.glob("*/vendor/llama.cpp"))


def _run(command: list[str], tool: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or result.stdout.strip().splitlines() or ["?"])[-1]
        raise BackendError(f"building {tool} failed: {last}", f"rerun by hand: {' '.join(command)}")


if __name__ == "__main__":  # python -m quantkit.llamacpp.build llama-server [jobs]
    jobs = int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count() or 2
    print(build_tool(sys.argv[1], jobs, log=lambda message: print(message, flush=True)))
