"""Task accuracy with lm-evaluation-harness for the baseline and an artifact; recovery %.

Each runtime says how lm-eval runs it (``Runtime.lm_eval_model``): transformers through
lm-eval's own ``hf`` model, every other runtime through ``RuntimeLM`` over the runtime's
scoring. Baseline results are cached per (model fingerprint, task data, settings, lm-eval
version, device, baseline precision).
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from quantkit.errors import MissingDependencyError, UserInputError
from quantkit.paths import cache_dir
from quantkit.results.manifest import TaskResult

if TYPE_CHECKING:
    from lm_eval.tasks import TaskManager

    from quantkit.inputs.specs import LmEvalSpec
    from quantkit.jsontypes import JsonDict
    from quantkit.runtimes.base import LmEvalModel, RuntimeSettings

# the metric whose recovery is reported, per task (first found wins)
_MAIN_METRICS = ("acc_norm,none", "acc,none", "exact_match,none", "word_perplexity,none")
_LOWER_IS_BETTER = ("perplexity",)


@functools.lru_cache(maxsize=1)
def _task_manager() -> TaskManager:
    """lm-eval's task index (built once per process: it reads every task's YAML)."""
    try:
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise MissingDependencyError("lm-eval is not installed", "pip install 'quantkit[lm-eval]'") from None
    from quantkit.evals.lm_eval_tasks import task_dir

    return TaskManager(include_path=str(task_dir()), verbosity="ERROR")


def check_tasks(tasks: list[str]) -> TaskManager:
    """Refuse task names lm-eval does not know, with close matches; return the TaskManager."""
    manager = _task_manager()
    known = set(manager.all_tasks)
    for task in tasks:
        if task not in known:
            close = difflib.get_close_matches(task, sorted(known), n=3, cutoff=0.6)
            hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else "see `lm_eval ls tasks`"
            raise UserInputError(f"lm-eval does not know task '{task}'", hint)
    return manager


def _run(model: LmEvalModel, spec: LmEvalSpec, manager: TaskManager) -> JsonDict:
    import contextlib
    import sys

    from lm_eval import simple_evaluate

    name_or_lm, model_args = model
    # lm-eval prints notices ("bootstrapping for stddev: ...") on stdout, which belongs to
    # quantkit's own output (a --format json document): they go to stderr
    with contextlib.redirect_stdout(sys.stderr):
        output = simple_evaluate(
            model=name_or_lm,
            model_args=model_args,
            tasks=list(spec.tasks),
            num_fewshot=spec.num_fewshot,
            limit=spec.limit,
            batch_size=spec.batch_size,
            task_manager=manager,
            log_samples=True,
            bootstrap_iters=1000,
            random_seed=0,
            numpy_random_seed=1234,
            torch_random_seed=1234,
            fewshot_random_seed=1234,
        )
    if output is None:  # pragma: no cover - only on non-zero ranks
        raise UserInputError("lm-eval returned no results", "rerun")
    return dict(output)


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _summarize(output: JsonDict) -> dict[str, TaskResult]:
    """Per task: its main metric, value, stderr and version."""
    summary: dict[str, TaskResult] = {}
    results = output.get("results")
    versions = output.get("versions")
    for task, values in (results if isinstance(results, dict) else {}).items():
        if not isinstance(values, dict):
            continue
        metric = next((m for m in _MAIN_METRICS if m in values), None)
        value = None if metric is None else _float(values[metric])
        if metric is None or value is None:
            continue
        name = metric.split(",")[0]
        summary[task] = TaskResult(
            metric=name,
            value=value,
            stderr=_float(values.get(f"{name}_stderr,none")),
            version=versions.get(task) if isinstance(versions, dict) else None,
            higher_is_better=not any(word in name for word in _LOWER_IS_BETTER),
        )
    return summary


def evaluate(
    model: LmEvalModel, spec: LmEvalSpec, manager: TaskManager, samples_dir: Path | None = None
) -> dict[str, TaskResult]:
    """Run the tasks of ``spec`` on one model; keep lm-eval's per-sample logs in ``samples_dir``."""
    output = _run(model, spec, manager)
    samples = output.get("samples")
    if samples_dir is not None and isinstance(samples, dict):
        samples_dir.mkdir(parents=True, exist_ok=True)
        for task, rows in samples.items():
            with (samples_dir / f"{task}.jsonl").open("w", encoding="utf-8") as handle:
                for row in rows if isinstance(rows, list) else []:
                    handle.write(json.dumps(row, default=str) + "\n")
    return _summarize(output)


def evaluate_in(
    kind: str, path: Path, settings: RuntimeSettings, spec: LmEvalSpec, samples_dir: Path | None = None
) -> dict[str, TaskResult]:
    """The tasks of ``spec`` on the model at ``path`` in the runtime registered as ``kind``."""
    from quantkit.runtimes import runtime_class

    manager = check_tasks(spec.tasks)
    return evaluate(runtime_class(kind).lm_eval_model(path, settings), spec, manager, samples_dir)


def baseline(
    path: Path, fingerprint: str, settings: RuntimeSettings, spec: LmEvalSpec
) -> tuple[dict[str, TaskResult], bool]:
    """Baseline task results (transformers), cached; returns (results, came_from_cache)."""
    from importlib import metadata

    from pydantic import TypeAdapter

    from quantkit.evals.lm_eval_tasks import data_digest
    from quantkit.inputs.tokens import WINDOW_RULES
    from quantkit.util.fileio import write_text_atomic

    adapter = TypeAdapter(dict[str, TaskResult])
    key_text = json.dumps(
        [
            fingerprint,
            spec.model_dump(mode="json"),
            data_digest(),
            metadata.version("lm_eval"),
            settings.device,
            settings.compute_dtype,  # a bfloat16 baseline's results are not a float32 one's
            f"window-rules={WINDOW_RULES}",  # the BOS rule: results from before it are not reused
        ]
    )
    cached = cache_dir() / "lm_eval" / f"{hashlib.sha256(key_text.encode()).hexdigest()[:32]}.json"
    if cached.is_file():
        return adapter.validate_json(cached.read_bytes()), True
    results = evaluate_in("hf", path, settings, spec)
    cached.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(cached, adapter.dump_json(results, indent=2).decode())
    return results, False


def recovery(base: dict[str, TaskResult], quant: dict[str, TaskResult]) -> dict[str, float]:
    """Recovered % per task (quantized / baseline; inverted for lower-is-better metrics)."""
    out: dict[str, float] = {}
    for task, entry in base.items():
        if task not in quant or entry.value == 0:
            continue
        ratio = quant[task].value / entry.value
        out[task] = 100.0 * (ratio if entry.higher_is_better else 1 / ratio)
    return out


def recovery_metrics(recovered: dict[str, float]) -> dict[str, float]:
    """Per-task recovery metrics plus their mean over every task (``task_recovery_pct``)."""
    metrics = {f"task_recovery_pct:{task}": value for task, value in recovered.items()}
    if recovered:
        metrics["task_recovery_pct"] = sum(recovered.values()) / len(recovered)
    return metrics
