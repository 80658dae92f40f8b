"""`quantkit runs list|show|clean`: what is in the runs folder, and cleaning up interrupted runs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer

from quantkit.cli.common import FormatOption
from quantkit.cli.output import OutputFormat, emit_json, stderr, stdout

app = typer.Typer(help="List, show and clean runs.", no_args_is_help=True)

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


def _interrupted(path: Path) -> dict[str, Any]:
    """What an interrupted run kept: its completed stages, and whether a process holds it."""
    from quantkit.journal import Journal
    from quantkit.store import is_locked

    journal = Journal.read(path) or {}
    return {
        "folder": path.name,
        "kind": "replaced" if ".old-" in path.name else "interrupted",
        "stages": list(journal.get("stages", {})),
        "recipe": journal.get("identity", {}).get("recipe", {}).get("name"),
        "running": is_locked(path),
    }


def _summary(path: Path) -> dict[str, Any]:
    from quantkit.errors import RunNotFoundError
    from quantkit.store import load_run

    try:
        manifest = load_run(path).manifest
    except RunNotFoundError as err:
        return {"run": path.name, "status": "incomplete", "detail": err.message}
    quantized = manifest.get("metrics", {}).get("quantized", {})
    gate = manifest.get("gate")
    return {
        "run": path.name,
        "status": "complete",
        "recipe": manifest.get("recipe", {}).get("name"),
        "method": manifest.get("recipe", {}).get("method"),
        "created": manifest.get("created"),
        "ppl_increase_pct": quantized.get("ppl_increase_pct", {}).get("value"),
        "kld_mean": quantized.get("kld_mean", {}).get("value"),
        "gate": None if gate is None else ("pass" if gate.get("passed") else "fail"),
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
        emit_json({"runs": rows, "leftovers": leftovers})
        return
    table = Table(title=f"runs in {folder}")
    for column in ("run", "status", "recipe", "method", "Δppl %", "KLD", "gate"):
        table.add_column(column)
    for row in rows:
        delta, kld = row.get("ppl_increase_pct"), row.get("kld_mean")
        table.add_row(
            row["run"],
            row["status"],
            row.get("recipe") or "",
            row.get("method") or "",
            "" if delta is None else f"{delta:+.2f}",
            "" if kld is None else f"{kld:.5f}",
            row.get("gate") or "",
        )
    stdout.print(table)
    for item in leftovers:
        if item["kind"] == "replaced":
            stderr.print(f"{item['folder']}: a run replaced by --overwrite (left by a crash)")
            continue
        state = "running" if item["running"] else "interrupted"
        stages = ", ".join(item["stages"]) or "no stage"
        stderr.print(f"{item['folder']}: {state}, {stages} completed")
    if any(not item["running"] for item in leftovers):
        stderr.print(
            "rerun the same quantize command to resume an interrupted run; `quantkit runs clean` removes them"
        )


@app.command("show")
def show(
    run: Path = typer.Argument(..., help="a run folder"), output_format: OutputFormat = FormatOption
) -> None:
    """Show a run's manifest (JSON) or its summary; for an interrupted run, its progress."""
    from quantkit.journal import Journal
    from quantkit.store import load_run

    journal = Journal.read(run) if run.is_dir() and not (run / "manifest.json").is_file() else None
    if journal is not None:
        progress = _interrupted(run) | {
            "completed": {name: stage.get("completed") for name, stage in journal.get("stages", {}).items()},
            "fingerprint": journal.get("fingerprint"),
        }
        if output_format == OutputFormat.json:
            emit_json(progress)
            return
        state = "running" if progress["running"] else "interrupted: rerun the same command to resume"
        stdout.print(f"{progress['folder']}: {state}")
        for name, when in progress["completed"].items():
            stdout.print(f"  {name:>10}  completed {when}")
        return
    record = load_run(run)
    if output_format == OutputFormat.json:
        emit_json(record.manifest)
        return
    for key, value in _summary(run).items():
        stdout.print(f"{key:>17}: {value}")
    stdout.print(f"{'timings':>17}: {record.manifest.get('timings')}")


@app.command("clean")
def clean(
    directory: Path | None = DirOption,
    older_than: float = typer.Option(
        60.0, "--older-than", min=0, help="minutes; younger leftovers may be live"
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="only list what would be removed"),
) -> None:
    """Remove leftovers of interrupted or replaced runs (never a complete or running one)."""
    from quantkit.store import is_locked, remove_partial

    now = time.time()
    removed = 0
    for path in _leftovers(_folder(directory)):
        if is_locked(path):
            stderr.print(f"kept {path.name} (a quantkit process is writing it)")
            continue
        if now - path.stat().st_mtime < older_than * 60:
            stderr.print(f"kept {path.name} (younger than {older_than:g} min: maybe still running)")
            continue
        if not dry_run and not remove_partial(path):  # under the lock: a writer may just start
            stderr.print(f"kept {path.name} (a quantkit process is writing it)")
            continue
        stderr.print(f"{'would remove' if dry_run else 'removed'} {path.name}")
        removed += 1
    stderr.print(f"{removed} leftover(s) {'to remove' if dry_run else 'removed'}")
