"""Shared driver for llm-compressor backends: load, ``oneshot``, save compressed-tensors."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

from quantkit.errors import BackendError, MissingDependencyError
from quantkit.faults import failpoint

if TYPE_CHECKING:
    from quantkit.backends.base import QuantizeJob
    from quantkit.calibration import TokenWindows


_LAYER = re.compile(r"\blayers\.(\d+)\.")


def _calibration_dataset(windows: TokenWindows) -> Any:
    from datasets import Dataset

    ids = [list(map(int, row)) for row in windows.ids]
    return Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(r) for r in ids]})


@contextmanager
def _layer_errors(job: QuantizeJob) -> Iterator[list[dict[str, Any]]]:
    """Collect the per-layer errors llm-compressor logs (GPTQ loss, AWQ scale-search error).

    llm-compressor reports them only through its loguru logger, so the logger is routed to a
    collecting sink for the duration (and to stderr as well with ``--verbose``).
    """
    import sys

    from loguru import logger

    errors: list[dict[str, Any]] = []
    pending: list[str] = []

    def sink(message: Any) -> None:
        record = message.record
        text = str(record["message"])
        layer = _LAYER.search(text)
        if layer:
            job.on_layer(int(layer.group(1)))
        if text.startswith("Quantizing ") and "module(s):" in text:
            with suppress(ValueError, SyntaxError):
                pending.extend(ast.literal_eval(text.split("module(s):", 1)[1].strip()))
        elif record["level"].name == "METRIC" and text.startswith("error "):
            name = pending.pop(0) if pending else None
            errors.append({"module": name, "method": record["function"], "loss": float(text.split()[1])})
        elif text.startswith("AWQ per-mapping error metrics:"):
            try:
                data = ast.literal_eval(text.split(":", 1)[1].strip())
                for item in data.get("metrics", []):
                    errors.append(
                        {
                            "module": item.get("layer_name"),
                            "method": "AWQ",
                            "initial_error": float(item.get("initial_error")),
                            "best_error": float(item.get("best_error")),
                        }
                    )
            except (ValueError, SyntaxError, TypeError, AttributeError):
                pass

    try:
        logger.level("METRIC")
    except ValueError:  # llm-compressor defines it only when its logging is enabled
        logger.level("METRIC", no=38)
    logger.remove()  # llm-compressor installs its own console handler on import
    sink_ids = [logger.add(sink, level="DEBUG", filter="llmcompressor")]
    if job.verbose:
        sink_ids.append(logger.add(sys.stderr, level="INFO"))
    logger.enable("llmcompressor")
    try:
        yield errors
    finally:
        for sink_id in sink_ids:
            logger.remove(sink_id)
        if not job.verbose:
            logger.disable("llmcompressor")
        logger.add(sys.stderr, level="WARNING")  # a plain default for the rest of the process


@contextmanager
def _cpu_only_compat() -> Iterator[None]:
    """Let llm-compressor's AWQ run on a machine with no accelerator.

    llm-compressor 0.14 pins cached activations in page-locked memory before AWQ's grid
    search (``IntermediatesCache.pin_memory``), which raises on a CPU-only torch. Pinning
    only speeds up host-to-device copies, so without an accelerator it is skipped.
    """
    import torch

    try:
        from llmcompressor.pipelines.cache import IntermediatesCache
    except ImportError:  # pragma: no cover - other llm-compressor layouts
        yield
        return
    if torch.accelerator.is_available() or not hasattr(IntermediatesCache, "pin_memory"):
        yield
        return
    original = IntermediatesCache.pin_memory
    IntermediatesCache.pin_memory = lambda self, *args, **kwargs: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        IntermediatesCache.pin_memory = original  # type: ignore[method-assign]


def run_oneshot(job: QuantizeJob, recipe: Any, calibration: TokenWindows | None) -> dict[str, Any]:
    """Run llm-compressor's ``oneshot`` with ``recipe`` (modifier or list) into ``job.out_dir``."""
    try:
        import llmcompressor
        from llmcompressor import oneshot
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            f"llm-compressor is not installed ({err.name})", "pip install 'quantkit[llmcompressor]'"
        ) from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quantkit.device import compute_dtype

    job.log("loading the model for quantization")
    model: Any = AutoModelForCausalLM.from_pretrained(
        job.model_path,
        dtype=compute_dtype(job.device),
        trust_remote_code=job.trust_remote_code,
    )
    if job.device != "cpu":
        model.to(job.device)
    tokenizer = AutoTokenizer.from_pretrained(job.model_path, trust_remote_code=job.trust_remote_code)
    kwargs: dict[str, Any] = {}
    if calibration is not None:
        kwargs = {
            "dataset": _calibration_dataset(calibration),
            "num_calibration_samples": len(calibration.ids),
            "max_seq_length": calibration.seq_len,
            "shuffle_calibration_samples": False,
        }
    names = [type(m).__name__ for m in (recipe if isinstance(recipe, list) else [recipe])]
    job.log(f"running llm-compressor oneshot ({' + '.join(names)})")
    with torch.random.fork_rng(devices=[]), _cpu_only_compat(), _layer_errors(job) as errors:
        torch.manual_seed(job.seed)  # the run's seed, without changing the caller's RNG state
        try:
            oneshot(model=model, recipe=recipe, **kwargs)
        except (RuntimeError, ValueError) as err:
            raise BackendError(
                f"llm-compressor failed: {str(err).splitlines()[0]}",
                "rerun with QUANTKIT_DEBUG=1 for the traceback",
            ) from err
    job.log("saving the compressed-tensors checkpoint")
    model.save_pretrained(job.out_dir, save_compressed=True)
    failpoint("save.weights")  # weights written, tokenizer not yet: a crash mid-save
    tokenizer.save_pretrained(job.out_dir)
    return {
        "library": "llmcompressor",
        "library_version": llmcompressor.__version__,
        "modifiers": names,
        "layer_errors": errors,
    }
