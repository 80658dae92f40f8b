"""File helpers: durable atomic writes, checksums and folder sizes (no quantkit imports)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def share_modes(root: Path) -> None:
    """Give every file under ``root`` (and ``root``) the permissions plain creation would:
    0666 / 0777 less the umask. Libraries that write through temporary files (transformers'
    safetensors, mkdtemp folders) leave 0600 / 0700, which hides a run from its group."""
    mask = _umask()
    paths = [root, *root.rglob("*")] if root.is_dir() else [root]
    for path in paths:
        if path.is_symlink():
            continue
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary sibling, fsync it and rename it over ``path``.

    The file gets the permissions a plain ``open(path, "w")`` would give it (0666 less the
    umask), not the 0600 of the temporary file.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), 0o666 & ~_umask())
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: object) -> None:
    """``data`` as indented JSON, written with ``write_text_atomic``."""
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def fsync_dir(folder: Path) -> None:
    """Make a folder's entries (new names, renames) durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    with path.open("rb") as handle:
        os.fsync(handle.fileno())


def files_under(folder: Path) -> list[Path]:
    """Every file below ``folder``, sorted (none when it does not exist)."""
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []


def folder_bytes(folder: Path) -> int:
    """Total size of every file under ``folder``."""
    return sum(p.stat().st_size for p in files_under(folder))


@contextmanager
def cache_entry_lock(entry: Path) -> Iterator[None]:
    """Hold an exclusive lock on one cache entry (``locks/`` in the cache) across processes, so
    a second process that needs the entry while the first makes it waits and reuses it, instead
    of making it again or replacing the folder under a reader. Check the entry again inside."""
    import fcntl

    from quantkit.paths import cache_dir

    # in a folder of their own: an entry whose making failed leaves nothing beside the entries
    locks = cache_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha256(str(entry.resolve()).encode()).hexdigest()[:32]
    with (locks / f"{name}.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
