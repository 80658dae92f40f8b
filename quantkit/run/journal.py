"""A run's progress, stage by stage: what completed, its results, and checksums of its files.

The journal lives in the run's hidden ``.NAME.partial`` folder as ``progress.json``. It is
rewritten atomically (and fsynced) after each stage, so after a crash it names exactly the
stages whose outputs were complete. A resumed run trusts a stage only if every file it
recorded still has the recorded size and sha256; otherwise the stage is redone from scratch.
The fingerprint (model, recipe, calibration and eval tokens, library versions, device) guards
resume: a journal written for anything else is refused, never mixed in.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from pydantic import JsonValue

from quantkit.errors import OutputError
from quantkit.util.fileio import file_sha256, fsync_dir, fsync_file, write_text_atomic

JOURNAL = "progress.json"
JOURNAL_SCHEMA = 2  # 2: typed stage results (quantkit 0.2)
SHARED_STAGES = frozenset({"reference"})  # outputs in the shared cache, not in the run
Entry = dict[str, JsonValue]


def fingerprint_digest(parts: dict[str, JsonValue]) -> str:
    """sha256 of the canonical JSON of ``parts``."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def fingerprint_differences(old: dict[str, JsonValue], new: dict[str, JsonValue]) -> list[str]:
    """Human-readable names of what differs between two fingerprints (nested one level)."""
    differences: list[str] = []
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key), new.get(key)
        if before == after:
            continue
        if isinstance(before, dict) and isinstance(after, dict):
            for sub in sorted(set(before) | set(after)):
                if before.get(sub) != after.get(sub):
                    differences.append(f"{key}.{sub}: {before.get(sub)} -> {after.get(sub)}")
        else:
            differences.append(key)
    return differences


class Journal:
    """The completed stages of one run being built in ``folder``.

    ``persist=False`` keeps it in memory: a finished run being updated (``bench RUN``) is
    journaled by its manifest, rewritten atomically at the end.
    """

    def __init__(
        self,
        folder: Path,
        identity: dict[str, JsonValue],
        fingerprint: dict[str, JsonValue],
        persist: bool = True,
    ) -> None:
        self.folder = folder
        self.identity = identity
        self.fingerprint = fingerprint
        self.persist = persist
        self.stages: dict[str, Entry] = {}
        self.resumed: list[str] = []  # stages taken from an earlier attempt, verified

    @property
    def path(self) -> Path:
        return self.folder / JOURNAL

    @staticmethod
    def read(folder: Path) -> dict[str, JsonValue] | None:
        """The raw journal in ``folder``, or None when absent or unreadable."""
        try:
            data = json.loads((folder / JOURNAL).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and data.get("schema_version") == JOURNAL_SCHEMA else None

    @classmethod
    def open(cls, folder: Path, identity: dict[str, JsonValue], fingerprint: dict[str, JsonValue]) -> Journal:
        """The journal for a fresh or resumed run; refuses one written for another fingerprint."""
        journal = cls(folder, identity, fingerprint)
        old = cls.read(folder)
        if old is None and (folder / JOURNAL).exists():
            raise OutputError(
                f"the interrupted run in '{folder}' has a journal this quantkit cannot read",
                "pass --restart to discard it and start over (or resume with the quantkit that made it)",
            )
        if old is not None:
            previous = old.get("fingerprint")
            previous = previous if isinstance(previous, dict) else {}
            if fingerprint_digest(previous) != fingerprint_digest(fingerprint):
                changed = fingerprint_differences(previous, fingerprint)
                raise OutputError(
                    f"the interrupted run in '{folder}' was made with a different "
                    f"{', '.join(changed[:3]) or 'fingerprint'}; it cannot be resumed",
                    "pass --restart to discard it and start over, or use another --out",
                )
            stages = old.get("stages")
            journal.stages = {
                k: v for k, v in (stages if isinstance(stages, dict) else {}).items() if isinstance(v, dict)
            }
        journal._write()
        return journal

    def _write(self) -> None:
        """Atomically and durably: the file is fsynced by ``write_text_atomic``, the rename here."""
        if not self.persist:
            return
        write_text_atomic(
            self.path,
            json.dumps(
                {
                    "schema_version": JOURNAL_SCHEMA,
                    "identity": self.identity,
                    "fingerprint": self.fingerprint,
                    "fingerprint_sha256": fingerprint_digest(self.fingerprint),
                    "stages": self.stages,
                },
                indent=1,
            ),
        )
        fsync_dir(self.folder)

    @staticmethod
    def _verify(path: Path, expected: JsonValue) -> bool:
        if not isinstance(expected, dict):
            return False
        return (
            path.is_file()
            and path.stat().st_size == expected.get("bytes")
            and file_sha256(path) == expected.get("sha256")
        )

    def _resolve(self, name: str) -> Path:
        path = Path(name)
        return path if path.is_absolute() else self.folder / path

    def completed(self, stage: str, exact: Path | None = None) -> Entry | None:
        """The stage's recorded result if it completed and all its files verify, else None.

        With ``exact`` (a folder), the folder must also hold no file the stage did not record.
        A stage that fails verification is forgotten, so the caller redoes it from scratch.
        """
        entry = self.stages.get(stage)
        if entry is None:
            return None
        files = entry.get("files")
        files = files if isinstance(files, dict) else {}
        verified = all(self._verify(self._resolve(name), expected) for name, expected in files.items())
        if verified and exact is not None:
            present = {str(p.relative_to(self.folder)) for p in exact.rglob("*") if not p.is_dir()}
            verified = present == {name for name in files if not Path(name).is_absolute()}
        if not verified:
            del self.stages[stage]
            self._write()
            return None
        if stage not in self.resumed:
            self.resumed.append(stage)
        result = entry.get("result")
        return result if isinstance(result, dict) else {}

    def complete(self, stage: str, result: Entry, files: list[Path] | None = None) -> None:
        """Record ``stage`` as complete with its result and the checksums of ``files``."""
        checksums: dict[str, JsonValue] = {}
        folder = self.folder.resolve()
        for path in sorted(files or []):
            full = path.resolve()  # files outside the run (shared cache) are kept absolute
            name = str(full.relative_to(folder)) if full.is_relative_to(folder) else str(full)
            checksums[name] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
        for path in files or []:  # the data must be on disk before the journal says so
            fsync_file(path)
        for parent in {path.resolve().parent for path in files or []}:
            fsync_dir(parent)
        self.stages[stage] = {
            "completed": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "files": checksums,
            "result": result,
        }
        self._write()

    def forget(self, *prefixes: str) -> None:
        """Drop recorded stages named ``prefix`` or ``prefix.N``: their inputs are being redone,
        so their results no longer belong to this run."""
        dropped = [s for s in self.stages if s in prefixes or s.split(".")[0] in prefixes]
        for stage in dropped:
            del self.stages[stage]
            if stage in self.resumed:
                self.resumed.remove(stage)
        if dropped:
            self._write()

    def holds_work(self) -> bool:
        """Whether a stage whose output lives only in this run has completed (worth keeping);
        the baseline reference lives in the shared cache and survives anyway."""
        return any(stage.split(".")[0] not in SHARED_STAGES for stage in self.stages)

    def checksums(self) -> dict[str, JsonValue]:
        """Per stage: completion time and file checksums (paths relative to the run)."""
        return {
            stage: {"completed": entry.get("completed"), "files": entry.get("files") or {}}
            for stage, entry in self.stages.items()
        }
