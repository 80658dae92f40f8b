"""Run folders: built in a temporary sibling and renamed into place only when complete."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantkit.errors import OutputError, RunNotFoundError
from quantkit.models import write_text_atomic

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = 1


def new_run_id(recipe_name: str) -> str:
    """A sortable, readable run id."""
    return time.strftime("%Y%m%d-%H%M%S") + f"-{recipe_name}"


def check_output(final_dir: Path, overwrite: bool, protected: list[Path], required_bytes: int = 0) -> None:
    """Refuse an output folder that exists (without overwrite), overlaps a source, or whose
    file system has less free space than ``required_bytes``."""
    resolved = final_dir.resolve()
    for source in protected:
        source = source.resolve()
        if resolved == source or source in resolved.parents or resolved in source.parents:
            raise OutputError(
                f"output '{final_dir}' overlaps the source model '{source}'",
                "choose an output folder outside the model folder",
            )
    if final_dir.exists() and not overwrite:
        raise OutputError(
            f"output folder '{final_dir}' already exists", "pass --overwrite or pick another --out"
        )
    if final_dir.exists() and not final_dir.is_dir():
        raise OutputError(f"output '{final_dir}' exists and is not a folder", "pick another --out")
    parent = final_dir.parent if final_dir.parent != Path("") else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"cannot create '{parent}' ({err.strerror})", "pick another --out") from None
    if not os.access(parent, os.W_OK):
        raise OutputError(f"output location '{parent}' is not writable", "pick another --out")
    free = shutil.disk_usage(parent).free
    if required_bytes and free < required_bytes:
        raise OutputError(
            f"not enough disk space in '{parent}': {free / 1e9:.2f} GB free, "
            f"about {required_bytes / 1e9:.2f} GB needed",
            "free some space or pick another --out",
        )


class RunWriter:
    """Writes a run into ``.<name>.partial-*`` beside ``final_dir``; ``commit`` renames it."""

    def __init__(self, final_dir: Path, overwrite: bool = False) -> None:
        self.final_dir = final_dir
        self.overwrite = overwrite
        self.tmp_dir = Path(tempfile.mkdtemp(dir=final_dir.parent, prefix=f".{final_dir.name}.partial-"))

    @property
    def artifact_dir(self) -> Path:
        return self.tmp_dir / "artifact"

    def write_json(self, name: str, data: Any) -> Path:
        path = self.tmp_dir / name
        write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")
        return path

    def write_text(self, name: str, text: str) -> Path:
        path = self.tmp_dir / name
        write_text_atomic(path, text)
        return path

    def commit(self) -> Path:
        """Move the finished run into place (replacing an old one only with overwrite)."""
        old: Path | None = None
        if self.final_dir.exists():
            if not self.overwrite:
                raise OutputError(
                    f"output folder '{self.final_dir}' appeared meanwhile", "pick another --out"
                )
            old = self.final_dir.with_name(f".{self.final_dir.name}.old-{os.getpid()}")
            os.replace(self.final_dir, old)
        os.replace(self.tmp_dir, self.final_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.final_dir

    def abort(self) -> None:
        shutil.rmtree(self.tmp_dir, ignore_errors=True)


@dataclass
class RunRecord:
    """A completed run read back from disk."""

    path: Path
    manifest: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.manifest.get("run_id", self.path.name))

    def metric(self, name: str) -> float | None:
        entry = self.manifest.get("metrics", {}).get("quantized", {}).get(name)
        return None if entry is None else entry.get("value")


def load_run(path: Path) -> RunRecord:
    """Read a finished run folder; partial or foreign folders are refused."""
    if not path.is_dir():
        raise RunNotFoundError(f"run '{path}' not found", "give a run folder made by quantkit quantize")
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise RunNotFoundError(
            f"'{path}' is not a complete quantkit run (no {MANIFEST})",
            "runs interrupted before the end leave no manifest; run quantize again",
        )
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise RunNotFoundError(f"{manifest_path} is not valid JSON", "the run folder is damaged") from None
    if not isinstance(manifest, dict) or manifest.get("status") != "complete":
        raise RunNotFoundError(f"'{path}' is not a complete quantkit run", "run quantize again")
    return RunRecord(path=path, manifest=manifest)
