"""Task accuracy with lm-evaluation-harness for the baseline and an artifact; recovery %.

HF formats run through lm-eval's ``hf`` model, GGUF through ``LlamaCppLM``. Baseline results
are cached per (model fingerprint, task data, settings, lm-eval version).
"""

from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path
from typing import Any

from quantkit.errors import MissingDependencyError, UserInputError
from quantkit.paths import cache_dir

# the metric whose recovery is reported, per task (first found wins)
_MAIN_METRICS = ("acc_norm,none", "acc,none", "exact_match,none", "word_perplexity,none")
_LOWER_IS_BETTER = ("perplexity",)


def _task_manager() -> Any:
    try:
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise MissingDependencyError("lm-eval is not installed", "pip install 'quantkit[lm-eval]'") from None
    from quantkit.evals.lm_eval_tasks import task_dir

    return TaskManager(include_path=str(task_dir()), verbosity="ERROR")


def check_tasks(tasks: list[str]) -> Any:
    """Refuse task names lm-eval does not know, with close matches; return the TaskManager."""
    manager = _task_manager()
    known = set(manager.all_tasks)
    for task in tasks:
        if task not in known:
            close = difflib.get_close_matches(task, sorted(known), n=3, cutoff=0.6)
            hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else "see `lm_eval ls tasks`"
            raise UserInputError(f"lm-eval does not know task '{task}'", hint)
    return manager


def _run(model: Any, model_args: dict[str, Any] | None, spec: Any, manager: Any) -> dict[str, Any]:
    from lm_eval import simple_evaluate

    output = simple_evaluate(
        model=model,
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


def _summarize(output: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per task: its main metric, value, stderr and version."""
    summary: dict[str, dict[str, Any]] = {}
    for task, values in output["results"].items():
        metric = next((m for m in _MAIN_METRICS if m in values), None)
        if metric is None:
            continue
        name = metric.split(",")[0]
        stderr = values.get(f"{name}_stderr,none")
        summary[task] = {
            "metric": name,
            "value": float(values[metric]),
            "stderr": None if stderr in (None, "N/A") else float(stderr),
            "version": output.get("versions", {}).get(task),
            "higher_is_better": not any(word in name for word in _LOWER_IS_BETTER),
        }
    return summary


def evaluate(
    runtime: str, path: Path, spec: Any, manager: Any, device: str, samples_dir: Path | None = None
) -> dict[str, dict[str, Any]]:
    """Run the tasks of ``spec`` on one model; keep lm-eval's per-sample logs in ``samples_dir``."""
    if runtime == "llamacpp":
        from quantkit.evals.lm_eval_llamacpp import LlamaCppLM

        output = _run(LlamaCppLM(path), None, spec, manager)
    else:
        args = {
            "pretrained": str(path),
            "dtype": "float32" if device == "cpu" else "bfloat16",
            "device": device,
        }
        output = _run("hf", args, spec, manager)
    if samples_dir is not None:
        samples_dir.mkdir(parents=True, exist_ok=True)
        for task, rows in output.get("samples", {}).items():
            with (samples_dir / f"{task}.jsonl").open("w", encoding="utf-8") as handle:
                for row in rows:
                    handle.write(json.dumps(row, default=str) + "\n")
    return _summarize(output)


def baseline(
    path: Path, fingerprint: str, spec: Any, manager: Any, device: str
) -> tuple[dict[str, dict[str, Any]], bool]:
    """Baseline task results, cached; returns (results, came_from_cache)."""
    from importlib import metadata

    from quantkit.evals.lm_eval_tasks import data_digest

    key_text = json.dumps(
        [fingerprint, spec.model_dump(mode="json"), data_digest(), metadata.version("lm_eval"), device]
    )
    cached = cache_dir() / "lm_eval" / f"{hashlib.sha256(key_text.encode()).hexdigest()[:32]}.json"
    if cached.is_file():
        return json.loads(cached.read_text()), True
    results = evaluate("hf", path, spec, manager, device)
    cached.parent.mkdir(parents=True, exist_ok=True)
    from quantkit.models import write_text_atomic

    write_text_atomic(cached, json.dumps(results, indent=2))
    return results, False


def recovery(base: dict[str, dict[str, Any]], quant: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Recovered % per task (quantized / baseline; inverted for lower-is-better metrics)."""
    out: dict[str, float] = {}
    for task, entry in base.items():
        if task not in quant or entry["value"] == 0:
            continue
        ratio = quant[task]["value"] / entry["value"]
        out[task] = 100.0 * (ratio if entry["higher_is_better"] else 1 / ratio)
    return out
