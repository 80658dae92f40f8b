"""The run manifest as typed, versioned pydantic models (read and written by ``quantkit.results.store``).

Schema 2 adds, to schema 1: the run's display ``name``, the model's parameter count, the
artifact's whole-file bits per weight, the runtime that scored it, and the bench's
measurement of the unquantized model in the artifact's own runtime. Schema-1 manifests load
unchanged (the new fields are optional) and are written back as schema 2.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from quantkit.evals.deployment import DeploymentScore
from quantkit.inputs.recipe import Recipe
from quantkit.inputs.specs import LmEvalSpec, RunKind
from quantkit.metrics import metric_info
from quantkit.results.gate import GateResult
from quantkit.serving.record import ServedQuality, ServeSection

MANIFEST_SCHEMA = 3  # 3: each stage's typed result in its stage record
READABLE_SCHEMAS = (1, 2, 3)


class Record(BaseModel):
    """Base of every manifest section: unknown keys are refused (a damaged or foreign file)."""

    model_config = ConfigDict(extra="forbid")


class FileChecksum(Record):
    bytes: int
    sha256: str


class StageRecord(Record):
    """A stage of the run: when it completed (None: it failed without failing the run, e.g. a
    bench that could not run), the size and sha256 of each file it produced, and its result in
    its stage's own model (``Stage.result_type``; schema 3)."""

    completed: str | None = None
    files: dict[str, FileChecksum] = Field(default_factory=dict)
    result: dict[str, JsonValue] | None = None


class ModelInfo(Record):
    spec: str
    kind: str
    path: str
    architecture: str
    fingerprint: str
    disk_bytes: int
    parameters: int | None = None


class Seeds(Record):
    run: int
    calibration: int | None = None


class WindowsInfo(BaseModel):
    """Token windows: their hash and shape, plus a description of their text source."""

    model_config = ConfigDict(extra="allow")

    hash: str
    windows: int
    seq_len: int
    tokens: int


class EvalInfo(WindowsInfo):
    top_k: int
    reference_key: str
    reference_cached: bool
    runtime: str | None = None  # the runtime that scored the artifact (schema 2)
    tail_samples: int = 0  # baseline tail ids per position for the KLD (schema 2)
    # "sampled-tail" (top-k exact + sampled tail) or "top-k+rest" (a lower bound); None: schema 1
    kld_estimator: str | None = None
    score: str = "all"  # the positions scored: all | second_half (schema 2)
    # the baseline sanity guard: passed | implausible (let through) | not judged (too few tokens)
    baseline_check: str | None = None
    # an artifact with its own tokenizer (GGUF): "passed: <text> <n> tokens, ..." or "mismatch
    # (reported): ..."; None: it reads the baseline's tokenizer files
    tokenizer_check: str | None = None
    deployment: DeploymentScore | None = None  # the eval text as the artifact's own tokenizer cuts it


class BaselineInfo(Record):
    dtype: str
    weight_bits: float


class ArtifactInfo(Record):
    """What the quantize stage made: format, runtime, scheme and bits."""

    path: str = "artifact"
    format: str
    runtime: str
    scheme: str
    weight_bits: float  # nominal bits per quantized weight (4.125 for W4 g128, 4.89 for Q4_K_M)
    disk_bytes: int = 0
    file_bpw: float | None = None  # bits per parameter of the whole file (schema 2)
    details: dict[str, JsonValue] = Field(default_factory=dict)


class MetricRecord(Record):
    value: float | None
    higher_is_better: bool
    unit: str
    description: str


def with_info(values: dict[str, float]) -> dict[str, MetricRecord]:
    """Metric values with their registry metadata, as the manifest stores them."""
    out: dict[str, MetricRecord] = {}
    for name, value in values.items():
        info = metric_info(name)
        out[name] = MetricRecord(
            value=value, higher_is_better=info.higher_is_better, unit=info.unit, description=info.description
        )
    return out


class MetricsRecord(Record):
    baseline: dict[str, MetricRecord] = Field(default_factory=dict)
    quantized: dict[str, MetricRecord] = Field(default_factory=dict)

    def values(self, side: Literal["baseline", "quantized"]) -> dict[str, float]:
        entries = self.baseline if side == "baseline" else self.quantized
        return {name: entry.value for name, entry in entries.items() if entry.value is not None}


class TaskResult(Record):
    """One lm-eval task's main metric."""

    metric: str
    value: float
    stderr: float | None
    version: JsonValue = None
    higher_is_better: bool = True


class LmEvalSection(Record):
    settings: LmEvalSpec
    baseline: dict[str, TaskResult]
    baseline_cached: bool
    artifact: dict[str, TaskResult]


class BenchSide(Record):
    """One model's speed and memory, measured in a fresh process."""

    runtime: str
    path: str | None = None
    load_s: float
    prefill_tok_s: dict[str, float]
    ttft_s: dict[str, float]
    decode_tok_s: float
    rss_before_load_bytes: int
    weights_memory_bytes: int
    peak_memory_bytes: int
    memory_kind: str
    threads: int
    batched_decode_tok_s: float | None = None
    batch_size: int | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None


class BenchSection(Record):
    schema_version: int = 1
    settings: dict[str, JsonValue]
    baseline: BenchSide
    artifact: BenchSide
    runtime_baseline: BenchSide | None = None  # the unquantized model in the artifact's runtime
    notes: list[str] = Field(default_factory=list)
    # sides measured once for a whole sweep and reused here ("baseline", "runtime_baseline")
    shared: list[str] = Field(default_factory=list)


class BenchFailure(Record):
    error: str


class ResumeInfo(Record):
    fingerprint_sha256: str
    fingerprint: dict[str, JsonValue]
    resumed_stages: list[str]


class EnvironmentInfo(Record):
    python: str
    libraries: dict[str, str | None]
    hardware: dict[str, JsonValue]
    torch_threads: int


class Manifest(Record):
    """Everything a finished run records: resolved recipe, model, tokens, artifact, metrics,
    gate verdict, stage checksums, resume fingerprint and environment."""

    schema_version: int
    status: Literal["complete"]
    kind: RunKind = "quantized"  # "external": an existing artifact evaluated, not made here
    run_id: str
    name: str | None = None  # what the run is: the recipe's name, plus option overrides
    created: str
    quantkit_version: str
    recipe: Recipe
    model: ModelInfo
    device: str
    seeds: Seeds
    calibration: WindowsInfo | None
    eval: EvalInfo
    baseline: BaselineInfo
    artifact: ArtifactInfo
    metrics: MetricsRecord
    gate: GateResult | None = None
    bench: BenchSection | BenchFailure | None = None
    lm_eval: list[LmEvalSection] | None = None
    serve: ServeSection | None = None  # latency under load through an endpoint (quantkit bench --endpoint)
    served_quality: ServedQuality | None = None  # quality through an endpoint (quantkit eval --endpoint)
    timings: dict[str, float] = Field(default_factory=dict)
    stages: dict[str, StageRecord] = Field(default_factory=dict)
    resume: ResumeInfo | None = None
    environment: EnvironmentInfo

    @property
    def display_name(self) -> str:
        return self.name or self.recipe.name

    def metric(self, name: str) -> float | None:
        entry = self.metrics.quantized.get(name)
        return None if entry is None else entry.value
