"""Fetch the wheels the GPU machine lacks into ``.whl/`` (``make gpu-wheels``), for ``make gpu-check``.

The GPU machine of issue #16 (an H200) has its own Python 3.12 with torch 2.11 (cu130),
transformers 5.17, accelerate and the packages in ``DEVICE``, and no network. quantkit runs
there from the source tree (``PYTHONPATH``); what it and the check import beyond ``DEVICE`` is
``CARRIED``: pure-Python wheels (and pydantic-core's cp312 manylinux wheel) pinned to
``constraints.txt``, downloaded here with ``pip download --no-deps --only-binary=:all:`` for
CPython 3.12 on manylinux x86_64, carried with the tree (``.whl/`` is git-ignored) and checked
to total under 64 MiB (what a device run may carry). Installed there with

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
        --target /tmp/site .whl/*.whl

Usage: python bench/gpu_wheels.py [--dest .whl] [--constraints constraints.txt]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_BYTES = 64 * 1024 * 1024

# The GPU machine's own packages (distribution names, as issue #16 lists them): never carried.
_DEVICE_NAMES = (
    "absl-py", "accelerate", "aiofiles", "aiohttp", "anyio", "attrs", "certifi",
    "charset-normalizer", "click", "cloudpickle", "filelock", "fsspec", "h11", "httpcore", "httpx",
    "huggingface-hub", "idna", "jinja2", "markdown-it-py", "markupsafe", "mdurl", "networkx",
    "numpy", "packaging", "pandas", "pillow", "pip", "protobuf", "psutil", "pyarrow", "pygments",
    "pytest", "pytest-timeout", "pyyaml", "regex", "requests", "rich", "safetensors", "scipy",
    "sentencepiece", "setuptools", "shellingham", "sympy", "tiktoken", "tokenizers", "torch",
    "tqdm", "transformers", "triton", "typer", "typing-extensions", "urllib3", "wheel", "xxhash",
)  # fmt: skip
DEVICE = frozenset(_DEVICE_NAMES)

# What quantkit and the check import there that the machine lacks: quantkit's own pydantic,
# llm-compressor (GPTQ, AWQ, RTN, FP8) with compressed-tensors and what they import (datasets
# with dill and multiprocess, loguru, nvidia-ml-py as pynvml), and gguf (quantkit's GGUF backend,
# used only where llama-cpp-python is present).
CARRIED = (
    "pydantic",
    "pydantic-core",
    "annotated-types",
    "typing-inspection",
    "llmcompressor",
    "compressed-tensors",
    "loguru",
    "datasets",
    "dill",
    "multiprocess",
    "nvidia-ml-py",
    "gguf",
)

# Required by a carried package but never imported on the check's paths (proved by the dry run
# in an environment holding only DEVICE + CARRIED: tests/unit/test_gpu_check.py).
NOT_NEEDED = {
    "auto-round": "llm-compressor imports it only for its AutoRoundModifier",
}

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them (``Typing_Extensions`` = ``typing-extensions``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(constraints: Path) -> dict[str, str]:
    """``name==version`` lines of a constraints file, by normalized name."""
    found: dict[str, str] = {}
    for line in constraints.read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)\s*(?:#.*)?", line)
        if match:
            found[normalize(match.group(1))] = match.group(2)
    return found


def download_command(requirements: list[str], dest: Path) -> list[str]:
    """``pip download`` of exactly ``requirements`` as CPython 3.12 manylinux x86_64 wheels."""
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", "3.12", "--implementation", "cp"]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    return [*command, "--dest", str(dest), *requirements]


def wheel_name(path: Path) -> str:
    """The normalized distribution name of a wheel file."""
    return normalize(path.name.split("-")[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=ROOT / ".whl")
    parser.add_argument("--constraints", type=Path, default=ROOT / "constraints.txt")
    args = parser.parse_args(argv)
    pinned = pins(args.constraints)
    missing = [name for name in CARRIED if normalize(name) not in pinned]
    if missing:
        print(f"gpu_wheels: {args.constraints} pins no version of {', '.join(missing)}", file=sys.stderr)
        return 2
    args.dest.mkdir(parents=True, exist_ok=True)
    wanted = {normalize(name) for name in CARRIED}
    for stale in args.dest.glob("*.whl"):  # wheels of packages no longer carried, or other versions
        version = stale.name.split("-")[1]
        if wheel_name(stale) not in wanted or pinned[wheel_name(stale)] != version:
            stale.unlink()
    requirements = [f"{name}=={pinned[normalize(name)]}" for name in CARRIED]
    result = subprocess.run(download_command(requirements, args.dest))
    if result.returncode != 0:
        return result.returncode
    wheels = sorted(args.dest.glob("*.whl"))
    total = sum(path.stat().st_size for path in wheels)
    for path in wheels:
        print(f"{path.stat().st_size / 1e6:8.2f} MB  {path.name}")
    print(f"{total / 1e6:8.2f} MB  in {len(wheels)} wheels (limit {LIMIT_BYTES / 2**20:.0f} MiB)")
    if {wheel_name(path) for path in wheels} != wanted:
        print(f"gpu_wheels: {args.dest} does not hold exactly the carried wheels", file=sys.stderr)
        return 1
    if total >= LIMIT_BYTES:
        print("gpu_wheels: the wheels exceed what a device run may carry", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
