"""Run folders: built in a temporary sibling and renamed into place only when complete."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pydantic import JsonValue, ValidationError

from quantkit.errors import ArtifactError, OutputError, RunNotFoundError
from quantkit.results.manifest import READABLE_SCHEMAS, Manifest
from quantkit.run.journal import JOURNAL, Journal
from quantkit.util.faults import failpoint
from quantkit.util.fileio import fsync_dir, share_modes, write_json_atomic, write_text_atomic

MANIFEST = "manifest.json"


def new_run_id(run_name: str) -> str:
    """A sortable, readable run id: the time, 24 random bits (runs started in the same second
    by sweep workers on several machines must not collide), then the run's name as a slug."""
    import secrets

    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", run_name).strip("-.") or "run"
    return time.strftime("%Y%m%d-%H%M%S") + f"-{secrets.token_hex(3)}-{slug}"


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


PARTIAL_SUFFIX = ".partial"
LOCK_FILE = ".lock"


def partial_dir(final_dir: Path) -> Path:
    """The hidden sibling a run is built in: ``.NAME.partial``."""
    return final_dir.with_name(f".{final_dir.name}{PARTIAL_SUFFIX}")


def final_dir_of(partial: Path) -> Path:
    """The run folder a ``.NAME.partial`` folder becomes when complete."""
    return partial.with_name(partial.name[1 : -len(PARTIAL_SUFFIX)])


def is_locked(folder: Path) -> bool:
    """Whether a live quantkit process holds ``folder``'s lock."""
    handle = _try_lock(folder, create=False)
    if handle is None:
        return (folder / LOCK_FILE).exists()
    handle.close()  # closing releases the lock taken here
    return False


def _try_lock(folder: Path, create: bool, wait_s: float = 0.0) -> IO[str] | None:
    """An open, exclusively flock-ed handle on ``folder``'s lock file, or None when another
    process holds it (or, without ``create``, when there is no lock file). Retries for
    ``wait_s``: another process may only be peeking (``is_locked``)."""
    import fcntl

    deadline = time.monotonic() + wait_s
    while True:
        try:
            handle = (folder / LOCK_FILE).open("a+" if create else "r")
        except OSError:
            return None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
            continue
        try:  # the file locked must still be the folder's (not unlinked by a finishing run)
            same = os.fstat(handle.fileno()).st_ino == (folder / LOCK_FILE).stat().st_ino
        except OSError:
            same = False
        if same:
            return handle
        handle.close()
        if not create:
            return None


def remove_partial(folder: Path) -> bool:
    """Remove an interrupted run's folder unless a live process holds it (checked under the
    lock, and the folder renamed away while held, so no writer can start on it meanwhile)."""
    handle = _try_lock(folder, create=False)
    if handle is None and (folder / LOCK_FILE).exists():
        return False
    doomed = folder.with_name(f"{folder.name}.removing-{os.getpid()}")
    try:
        os.replace(folder, doomed)
    finally:
        if handle is not None:
            handle.close()
    shutil.rmtree(doomed, ignore_errors=True)
    return True


class _RunFiles:
    """Atomic writes into the folder a run's files go to now (``folder``)."""

    @property
    def folder(self) -> Path:
        raise NotImplementedError

    @property
    def artifact_dir(self) -> Path:
        return self.folder / "artifact"

    def write_json(self, name: str, data: JsonValue) -> Path:
        path = self.folder / name
        write_json_atomic(path, data)
        return path

    def write_text(self, name: str, text: str) -> Path:
        path = self.folder / name
        write_text_atomic(path, text)
        return path


class RunWriter(_RunFiles):
    """Builds a run in ``.NAME.partial`` beside ``final_dir`` under an exclusive lock.

    The folder's journal records completed stages, so an interrupted run can be resumed;
    ``commit`` renames the folder into place, ``release`` keeps it for a later resume and
    ``abort`` removes it.
    """

    def __init__(self, final_dir: Path, overwrite: bool = False) -> None:
        self.final_dir = final_dir
        self.overwrite = overwrite
        self.tmp_dir = partial_dir(final_dir)
        self.created = not self.tmp_dir.exists()
        self.tmp_dir.mkdir(exist_ok=True)
        lock = _try_lock(self.tmp_dir, create=True, wait_s=2.0)
        if lock is None:
            raise OutputError(
                f"another quantkit process is writing '{final_dir}'",
                "wait for it to finish, or pick another --out",
            )
        self._lock = lock
        self._lock.seek(0)
        self._lock.truncate()
        self._lock.write(f"{os.getpid()}\n")
        self._lock.flush()
        self.journal: Journal | None = None

    @property
    def folder(self) -> Path:
        """Where the run's files are written now (the hidden partial folder)."""
        return self.tmp_dir

    def open_journal(self, identity: dict[str, JsonValue], fingerprint: dict[str, JsonValue]) -> Journal:
        """The run's journal (resumed when the folder holds one with the same fingerprint)."""
        self.journal = Journal.open(self.tmp_dir, identity, fingerprint)
        return self.journal

    def commit(self) -> Path:
        """Move the finished run into place (replacing an old one only with overwrite).

        The journal goes only after the rename: a crash at any point leaves either the
        resumable partial folder or the complete run (plus, with overwrite, the replaced run
        as ``.NAME.old-*`` until the rename is done).
        """
        old: Path | None = None
        if self.final_dir.exists():
            if not self.overwrite:
                raise OutputError(
                    f"output folder '{self.final_dir}' appeared meanwhile", "pick another --out"
                )
            old = self.final_dir.with_name(f".{self.final_dir.name}.old-{os.getpid()}")
            os.replace(self.final_dir, old)
        share_modes(self.tmp_dir)
        failpoint("commit.rename")
        os.replace(self.tmp_dir, self.final_dir)
        fsync_dir(self.final_dir.parent)
        (self.final_dir / JOURNAL).unlink(missing_ok=True)  # its checksums are in the manifest
        (self.final_dir / LOCK_FILE).unlink(missing_ok=True)
        self._lock.close()
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.final_dir

    def release(self) -> None:
        """Release the lock; keep the partial folder for a later resume (or remove it if this
        writer created it and nothing was recorded in it)."""
        if self.created and (self.journal is None or not self.journal.stages):
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
        self._lock.close()

    def abort(self) -> None:
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        self._lock.close()


class RunUpdater(_RunFiles):
    """A finished run being updated in place (``quantkit bench RUN``, ``quantkit eval RUN``),
    under the same exclusive lock a writer holds; each file is replaced atomically."""

    def __init__(self, run_dir: Path) -> None:
        self.final_dir = run_dir
        lock = _try_lock(run_dir, create=True, wait_s=2.0)
        if lock is None:
            raise OutputError(
                f"another quantkit process is updating '{run_dir}'", "wait for it to finish, then run again"
            )
        self._lock = lock

    @property
    def folder(self) -> Path:
        return self.final_dir

    def release(self) -> None:
        (self.final_dir / LOCK_FILE).unlink(missing_ok=True)
        share_modes(self.final_dir)  # what lm-eval and the bench wrote, as the umask says
        self._lock.close()


@dataclass
class RunRecord:
    """A completed run read back from disk."""

    path: Path
    manifest: Manifest

    @property
    def name(self) -> str:
        return self.manifest.run_id

    def metric(self, name: str) -> float | None:
        return self.manifest.metric(name)


def _file_kind(path: Path) -> str:
    """What a file given where a run folder belongs looks like (for the error message)."""
    try:
        with path.open("rb") as handle:
            magic = handle.read(4)
    except OSError:
        return "a file"
    if magic == b"GGUF":
        return "a GGUF file"
    if path.suffix == ".safetensors":
        return "a safetensors file"
    if path.name == MANIFEST:
        return "a run's manifest file (give its folder)"
    return "a file"


def load_run(path: Path) -> RunRecord:
    """Read a finished run folder; partial, foreign or damaged folders are refused."""
    if path.is_file():
        kind = _file_kind(path)
        raise RunNotFoundError(
            f"'{path}' is {kind}, not a run folder",
            "give a folder made by quantkit quantize; to evaluate a model file against its source: "
            "quantkit eval --baseline SOURCE FILE",
        )
    if not path.is_dir():
        raise RunNotFoundError(f"run '{path}' not found", "give a run folder made by quantkit quantize")
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise RunNotFoundError(
            f"'{path}' is not a complete quantkit run (no {MANIFEST})",
            "an interrupted run resumes when the same quantize command is run again "
            "(quantkit runs list shows interrupted runs)",
        )
    try:
        data = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise RunNotFoundError(f"{manifest_path} is not valid JSON", "the run folder is damaged") from None
    if not isinstance(data, dict) or data.get("status") != "complete":
        raise RunNotFoundError(f"'{path}' is not a complete quantkit run", "run quantize again")
    if data.get("schema_version") not in READABLE_SCHEMAS:
        raise RunNotFoundError(
            f"{manifest_path} has schema {data.get('schema_version')!r}; this quantkit reads "
            f"{', '.join(map(str, READABLE_SCHEMAS))}",
            "read it with the quantkit that wrote it, or run quantize again",
        )
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise RunNotFoundError(
            f"{manifest_path} is damaged: '{where}': {first['msg']}",
            "copy the run again or run quantize again",
        ) from None
    _check_recorded_sizes(path, manifest)
    return RunRecord(path=path, manifest=manifest)


def _check_recorded_sizes(path: Path, manifest: Manifest) -> None:
    """Refuse a run whose artifact files no longer have the sizes its manifest recorded (a
    truncated copy, a half-synced folder). Sizes only: cheap enough for every command that
    reads runs. (Later commands may add lm-eval samples; the artifact never changes.)"""
    quantize_stage = manifest.stages.get("quantize")
    for name, recorded in (quantize_stage.files if quantize_stage else {}).items():
        file = path / name
        actual = file.stat().st_size if file.is_file() else None
        if actual != recorded.bytes:
            found = "is missing" if actual is None else f"has {actual} bytes"
            raise ArtifactError(
                f"run '{path}' is damaged: {name} {found}, the manifest recorded {recorded.bytes}",
                "copy the run folder again, or re-run quantize",
            )


def find_resumable(folder: Path, identity: dict[str, JsonValue]) -> Path | None:
    """The newest ``.NAME.partial`` in ``folder`` left by the same command (``identity``) and
    not held by a live process; its run folder is ``final_dir_of`` it."""
    if not folder.is_dir():
        return None
    candidates = sorted(
        (p for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(PARTIAL_SUFFIX)),
        reverse=True,
    )
    for candidate in candidates:
        journal = Journal.read(candidate) if candidate.is_dir() else None
        if journal is not None and journal.get("identity") == identity and not is_locked(candidate):
            return candidate
    return None
