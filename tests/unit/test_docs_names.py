"""docs/ describe the code as it is: every dotted name of a quantkit module, every repository
path and every `quantkit` command they cite in backticks exists."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import quantkit

ROOT = Path(__file__).resolve().parents[2]
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
_TICKED = re.compile(r"`([^`\n]+)`")
_DOTTED = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+(\(\))?$")
_FILE_SUFFIX = re.compile(
    r"\.(md|json|jsonl|html|htm|yaml|yml|py|gguf|txt|log|safetensors|toml|csv|svg|png|xml)$"
)
_PATH_ROOTS = ("quantkit/", "tests/", "bench/", "docs/", "recipes/", "calibration/", ".ci/")
# paths the docs name as what a command writes, not files of the repository
_WRITTEN_BY_COMMANDS = {"bench/results/gpu_check.json"}  # `make gpu-check` on a GPU machine
# every module and package of quantkit by its dotted path under quantkit; docs name the modules
# of the core packages by their own name (`store.load_run`: quantkit.results.store.load_run)
_DOTTED_MODULES = [
    m.name.removeprefix("quantkit.") for m in pkgutil.walk_packages(quantkit.__path__, "quantkit.")
]
_CORE = ("run", "inputs", "llamacpp", "results", "util", "metrics")
MODULES = {name.split(".")[0] for name in _DOTTED_MODULES} | {
    name.split(".")[1] for name in _DOTTED_MODULES if name.startswith(tuple(f"{core}." for core in _CORE))
}


def _ticked(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return _TICKED.findall(text)


def _resolves(dotted: str) -> bool:
    """``dotted`` names something under quantkit: as written, or with its first part read as a
    module's own name (``store.load_run``: quantkit.results.store.load_run)."""
    parts = dotted.removesuffix("()").split(".")
    if parts[0] == "quantkit":
        return _resolves_parts(parts)
    homes = [name.split(".") for name in _DOTTED_MODULES if name.rsplit(".", 1)[-1] == parts[0]]
    return any(_resolves_parts(["quantkit", *home, *parts[1:]]) for home in homes) or _resolves_parts(
        ["quantkit", *parts]
    )


def _resolves_parts(parts: list[str]) -> bool:
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                fields = getattr(target, "model_fields", None) or getattr(target, "__dataclass_fields__", {})
                # a field of a model is enough: its type is not followed
                return attribute in fields or attribute in getattr(target, "__annotations__", {})
            target = getattr(target, attribute)
        return True
    return False


def _commands() -> set[str]:
    import typer

    from quantkit.cli import app

    root = typer.main.get_command(app)
    return set(getattr(root, "commands", {}))


def _data_keys() -> set[str]:
    """Top-level keys of a recipe and of a manifest: `calibration.seq_len` and
    `metrics.quantized` name fields of files, not the modules of the same name."""
    from quantkit.inputs.recipe import Recipe
    from quantkit.results.manifest import Manifest

    return set(Recipe.model_fields) | set(Manifest.model_fields)


def _entry_point_groups() -> set[str]:
    """The registries' entry-point groups (``quantkit.servers`` names a group, not a module)."""
    from quantkit.backends import BACKENDS
    from quantkit.runtimes import RUNTIMES
    from quantkit.serving.server import SERVERS
    from quantkit.stages import STAGES
    from quantkit.sweep.executors import EXECUTORS

    registries = (BACKENDS, RUNTIMES, STAGES, EXECUTORS, SERVERS)
    return {registry.group for registry in registries if registry.group}


def _missing(doc: Path) -> list[str]:
    commands, data_keys, groups = _commands(), _data_keys(), _entry_point_groups()
    missing = []
    for token in (token.strip() for token in _ticked(doc)):
        if token.startswith(_PATH_ROOTS) and not re.search(r"[<>*{}\s]|NAME|\.\.\.", token):
            path = token.split(":")[0].rstrip("/")
            if path not in _WRITTEN_BY_COMMANDS and not (ROOT / path).exists():
                missing.append(f"path {token}")
        elif token.startswith("quantkit ") and not token.startswith("quantkit --"):
            command = token.split()[1]
            if re.fullmatch(r"[a-z][a-z-]*", command) and command not in commands:
                missing.append(f"command {token}")
        elif _DOTTED.match(token) and not _FILE_SUFFIX.search(token):
            first = token.split(".")[0]
            known = first == "quantkit" or (first in MODULES and first not in data_keys)
            if known and token not in groups and not _resolves(token):
                missing.append(f"name {token}")
    return missing


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
def test_the_names_a_doc_cites_exist(doc: Path) -> None:
    assert _missing(doc) == []


def test_the_check_finds_what_does_not_exist(tmp_path: Path) -> None:
    """Negative control: a wrong module attribute, path and command are each reported, a
    recipe field is not."""
    doc = tmp_path / "wrong.md"
    doc.write_text(
        "`store.write_manifest`, `store.load_run`, `quantkit/nowhere.py`, `quantkit/results/store.py`,\n"
        "`quantkit frobnicate`, `quantkit report RUN`, `eval.seq_len`, `quantkit.metrics.NOPE`\n"
    )
    assert _missing(doc) == [
        "name store.write_manifest",
        "path quantkit/nowhere.py",
        "command quantkit frobnicate",
        "name quantkit.metrics.NOPE",
    ]
