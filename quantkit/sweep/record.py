"""The sweep folder and its manifest (``sweep.json``): the spec, its expansion, the baselines
measured once, each run's state; and the check that a finished run is still intact."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from quantkit.sweep.task import RunOutcome, RunState

SWEEP_MANIFEST = "sweep.json"
SWEEP_SCHEMA = 1


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BaselineRecord(Record):
    """One baseline (model, device, precision, eval windows): computed once, shared by its runs."""

    reference_key: str
    model: str | None
    model_path: str
    device: str
    dtype: str | None = None  # the baseline's precision (None: written before it was recorded)
    runs: list[str]
    reference_computed: bool  # False: it was already in the cache
    reference_s: float | None = None
    bench_sides_measured: int = 0  # baseline bench processes run for this sweep
    bench_sides_reused: int = 0  # found already measured in the sweep folder
    bench_s: float | None = None
    lm_eval_computed: int = 0  # lm-eval baselines computed for this sweep (not cached before)
    host: str = ""  # the machine the baseline phase ran on
    node: str = ""  # its Ray node (empty with the local executor, which runs it in the driver)


class SweepRun(Record):
    """One point of the sweep and how it went."""

    run_id: str
    name: str
    recipe_ref: str
    overrides: list[str]
    model: str | None
    recipe: dict[str, JsonValue]  # the resolved recipe (what resume compares)
    reference_key: str
    state: RunState = "queued"
    exit_code: int | None = None
    path: str | None = None
    error: str | None = None
    hint: str | None = None
    kld: float | None = None
    gate_passed: bool | None = None
    host: str = ""
    node: str = ""  # the Ray node it ran on
    seconds: float | None = None
    kept: bool = False  # finished in an earlier invocation and verified, not run again

    def take(self, outcome: RunOutcome) -> None:
        """How the run ended, as its worker reported it."""
        for name in _OUTCOME_FIELDS:
            setattr(self, name, getattr(outcome, name))


# what a worker's outcome says that the sweep's record keeps (the rest is the worker's own)
_OUTCOME_FIELDS = sorted((set(RunOutcome.model_fields) & set(SweepRun.model_fields)) - {"run_id"})


class SweepManifest(Record):
    schema_version: int = SWEEP_SCHEMA
    name: str
    created: str
    updated: str
    spec: dict[str, JsonValue]
    executor: str
    baselines: list[BaselineRecord] = Field(default_factory=list)
    runs: list[SweepRun]
    timings: dict[str, float] = Field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """The work of this sweep: K artifact evaluations against how many baselines."""
        return {
            "runs": len(self.runs),
            "done": sum(run.state == "done" for run in self.runs),
            "failed": sum(run.state == "failed" for run in self.runs),
            "baselines": len(self.baselines),
            "references_computed": sum(base.reference_computed for base in self.baselines),
            "baseline_bench_sides_measured": sum(base.bench_sides_measured for base in self.baselines),
        }


def read_manifest(folder: Path) -> SweepManifest | None:
    """The sweep manifest in ``folder``, or None when there is none."""
    from pydantic import ValidationError

    from quantkit.errors import OutputError

    path = folder / SWEEP_MANIFEST
    if not path.is_file():
        return None
    try:
        return SweepManifest.model_validate_json(path.read_text(encoding="utf-8"))
    except (ValidationError, ValueError, UnicodeDecodeError):
        raise OutputError(
            f"{path} is not a sweep manifest this quantkit reads", "give a new --out folder"
        ) from None


def write_manifest(folder: Path, manifest: SweepManifest) -> None:
    from quantkit.util.fileio import write_text_atomic

    write_text_atomic(folder / SWEEP_MANIFEST, manifest.model_dump_json(indent=2) + "\n")


def verified_run(path: Path) -> bool:
    """True when ``path`` is a finished run whose artifact files still match their checksums."""
    from quantkit.errors import QuantkitError
    from quantkit.results.store import load_run
    from quantkit.util.fileio import file_sha256

    try:
        record = load_run(path)
    except QuantkitError:
        return False
    stage = record.manifest.stages.get("quantize")
    if stage is None:
        return False
    return all(file_sha256(path / name) == recorded.sha256 for name, recorded in stage.files.items())
