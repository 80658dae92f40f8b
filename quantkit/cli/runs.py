"""`quantkit runs list|show|clean`: what is in the runs folder, and cleaning up interrupted runs."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import typer
from pydantic import JsonValue
from rich.markup import escape

from quantkit.cli.common import FormatOption, help_markup
from quantkit.cli.output import OutputFormat, emit_json, stderr, stdout

app = typer.Typer(help="List, show and clean runs.", no_args_is_help=True, rich_markup_mode=help_markup())

DirOption = typer.Option(None, "--dir", "-d", help="runs folder (default: $QUANTKIT_RUNS_DIR or ./runs)")


def _folder(directory: Path | None) -> Path:
    from quantkit.paths import runs_dir

    return directory or runs_dir()


def _leftovers(folder: Path) -> list[Path]:
    """Hidden folders of interrupted runs (``.NAME.partial``) and replaced ones (``.NAME.old-*``)."""
    if not folder.is_dir():
        return []
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_dir() and p.name.startswith(".") and (".partial" in p.name or ".old-" in p.name)
    )


@dataclass
class Leftover:
    """A hidden folder an interrupted (or replaced) run left behind."""

    folder: str
    kind: str  # "interrupted" | "replaced"
    stages: list[str]
    recipe: str | None
    running: bool

    def to_json(self) -> dict[str, JsonValue]:
        stages: list[JsonValue] = list(self.stages)
        return {
            "folder": self.folder,
            "kind": self.kind,
            "stages": stages,
            "recipe": self.recipe,
            "running": self.running,
        }


def _interrupted(path: Path) -> Leftover:
    """What an interrupted run kept: its completed stages, and whether a process holds it."""
    from quantkit.results.store import is_locked
    from quantkit.run.journal import Journal

    journal = Journal.read(path) or {}
    stages = journal.get("stages")
    identity = journal.get("identity")
    recipe = identity.get("recipe") if isinstance(identity, dict) else None
    name = recipe.get("name") if isinstance(recipe, dict) else None
    return Leftover(
        folder=path.name,
        kind="replaced" if ".old-" in path.name else "interrupted",
        stages=list(stages) if isinstance(stages, dict) else [],
        recipe=None if name is None else str(name),
        running=is_locked(path),
    )


def _summary(path: Path) -> dict[str, JsonValue]:
    from quantkit.errors import UserInputError
    from quantkit.report.table import method_label
    from quantkit.results.store import load_run

    try:
        manifest = load_run(path).manifest
    except UserInputError as err:  # incomplete, foreign or damaged: listed, not fatal
        return {"run": path.name, "status": "incomplete", "detail": err.message}
    gate = manifest.gate
    return {
        "run": path.name,
        "status": "complete",
        "name": manifest.display_name,
        "recipe": manifest.recipe.name,
        "method": method_label(manifest),
        "created": manifest.created,
        "ppl_increase_pct": manifest.metric("ppl_increase_pct"),
        "kld_mean": manifest.metric("kld_mean"),
        "gate": None if gate is None else ("pass" if gate.passed else "fail"),
    }


@app.command("list")
def list_runs(directory: Path | None = DirOption, output_format: OutputFormat = FormatOption) -> None:
    """List runs (complete and incomplete) and leftovers of interrupted ones."""
    from rich.table import Table

    folder = _folder(directory)
    runs = (
        sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        if folder.is_dir()
        else []
    )
    rows = [_summary(path) for path in runs]
    leftovers = [_interrupted(p) for p in _leftovers(folder)]
    if output_format == OutputFormat.json:
        emit_json({"runs": rows, "leftovers": [item.to_json() for item in leftovers]})
        return
    table = Table(title=f"runs in {folder}")
    for column in ("run", "status", "recipe", "method", "Δppl %", "KLD", "gate"):
        table.add_column(column)
    from quantkit.report.table import format_cell

    for row in rows:
        table.add_row(
            escape(str(row["run"])),
            str(row["status"]),
            str(row.get("recipe") or ""),
            str(row.get("method") or ""),
            format_cell("ppl_increase_pct", row.get("ppl_increase_pct")),
            format_cell("kld_mean", row.get("kld_mean")),
            str(row.get("gate") or ""),
        )
    stdout.print(table)
    for item in leftovers:
        if item.kind == "replaced":
            stderr.print(f"{item.folder}: a run replaced by --overwrite (left by a crash)")
            continue
        state = "running" if item.running else "interrupted"
        stderr.print(f"{item.folder}: {state}, {', '.join(item.stages) or 'no stage'} completed")
    if any(not item.running for item in leftovers):
        stderr.print(
            "rerun the same quantize command to resume an interrupted run; `quantkit runs clean` removes them"
        )


@app.command("show")
def show(
    run: Path = typer.Argument(..., help="a run folder"), output_format: OutputFormat = FormatOption
) -> None:
    """Show a run's manifest (JSON) or its summary; for an interrupted run, its progress."""
    from quantkit.results.store import load_run
    from quantkit.run.journal import Journal

    journal = Journal.read(run) if run.is_dir() and not (run / "manifest.json").is_file() else None
    if journal is not None:
        stages = journal.get("stages")
        completed: dict[str, JsonValue] = {
            name: stage.get("completed") if isinstance(stage, dict) else None
            for name, stage in (stages if isinstance(stages, dict) else {}).items()
        }
        progress = _interrupted(run).to_json() | {
            "completed": completed,
            "fingerprint": journal.get("fingerprint"),
        }
        if output_format == OutputFormat.json:
            emit_json(progress)
            return
        state = "running" if progress["running"] else "interrupted: rerun the same command to resume"
        stdout.print(f"{progress['folder']}: {state}")
        for name, when in completed.items():
            stdout.print(f"  {name:>10}  completed {when}")
        return
    record = load_run(run)
    if output_format == OutputFormat.json:
        emit_json(record.manifest.model_dump(mode="json"))
        return
    for key, value in _summary(run).items():
        stdout.print(escape(f"{key:>17}: {value}"))
    stdout.print(f"{'timings':>17}: {record.manifest.timings}")
    for name, stage in record.manifest.stages.items():
        files = (
            ", ".join(f"{path} {checksum.sha256[:12]}" for path, checksum in stage.files.items())
            or "no files"
        )
        stdout.print(escape(f"{'stage ' + name:>17}: completed {stage.completed}; {files}"))


@app.command("clean")
def clean(
    directory: Path | None = DirOption,
    older_than: float = typer.Option(
        60.0, "--older-than", min=0, help="minutes; younger leftovers may be live"
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="only list what would be removed"),
    output_format: OutputFormat = FormatOption,
) -> None:
    """Remove leftovers of interrupted or replaced runs (never a complete or running one)."""
    from quantkit.results.store import is_locked, remove_partial

    now = time.time()
    outcome: dict[str, list[JsonValue]] = {"removed": [], "kept": []}
    for path in _leftovers(_folder(directory)):
        if is_locked(path):
            reason = "a quantkit process is writing it"
        elif now - path.stat().st_mtime < older_than * 60:
            reason = f"younger than {older_than:g} min: maybe still running"
        elif not dry_run and not remove_partial(path):  # under the lock: a writer may just start
            reason = "a quantkit process is writing it"
        else:
            stderr.print(f"{'would remove' if dry_run else 'removed'} {path.name}")
            outcome["removed"].append(path.name)
            continue
        stderr.print(f"kept {path.name} ({reason})")
        outcome["kept"].append({"folder": path.name, "reason": reason})
    stderr.print(f"{len(outcome['removed'])} leftover(s) {'to remove' if dry_run else 'removed'}")
    if output_format == OutputFormat.json:
        emit_json({"dry_run": dry_run, **outcome})
