"""Shared driver for llm-compressor backends: load, ``oneshot``, save compressed-tensors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from quantkit.errors import BackendError, MissingDependencyError
from quantkit.util.faults import failpoint

if TYPE_CHECKING:
    from pathlib import Path

    import torch
    from datasets import Dataset
    from llmcompressor.modifiers import Modifier
    from pydantic import JsonValue
    from transformers import PreTrainedModel

    from quantkit.backends.base import QuantizeJob
    from quantkit.inputs.calibration import TokenWindows

    OneshotRecipe = Modifier | list[Modifier]


def _calibration_dataset(windows: TokenWindows) -> Dataset:
    from datasets import Dataset

    ids = [list(map(int, row)) for row in windows.ids]
    return Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(r) for r in ids]})


# llm-compressor has no public hook for per-module losses; the two methods
# _llmcompressor_hooks wraps are those of these releases (pyproject pins 0.14.0.1)
PATCHED_FOR = "0.14"


@contextmanager
def _patched(owner: type, attribute: str, replacement: object) -> Iterator[None]:
    """Set a class attribute for the duration (restored exactly, also as a classmethod); an
    llm-compressor these patches were not written for is refused, not silently mis-patched."""
    from importlib import metadata

    version = metadata.version("llmcompressor")
    if (
        not (version == PATCHED_FOR or version.startswith(PATCHED_FOR + "."))
        or attribute not in owner.__dict__
    ):
        raise BackendError(
            f"llm-compressor {version} is not the {PATCHED_FOR}.x quantkit's per-layer progress and "
            f"loss recording wrap ({owner.__name__}.{attribute})",
            "pip install 'llmcompressor==0.14.0.1' (quantkit's pin)",
        )
    original = owner.__dict__[attribute]
    setattr(owner, attribute, replacement)
    try:
        yield
    finally:
        setattr(owner, attribute, original)


@contextmanager
def _llmcompressor_hooks(job: QuantizeJob, model: torch.nn.Module) -> Iterator[list[JsonValue]]:
    """Per-module errors from llm-compressor's own objects, not its logs, by the two patches
    :func:`_patched` checks (per-layer progress needs none: llmcompressor_observer.py).

    No lifecycle event carries a loss, and the losses are no modifier's public state:
    - GPTQ: ``GPTQModifier.compress_module_list`` (modifiers/gptq/base.py) keeps each module's
      Hessian loss in a local and hands it only to ``CompressionLogger.set_results``
      (utils/metric_logging.py), whose log line rounds it to two decimals; this keeps the float;
    - AWQ: ``AWQModifier._apply_smoothing`` (modifiers/transform/awq/base.py) appends to the
      private ``_error_metrics``, read here when ``on_finalize`` logs them through
      ``_log_error_metrics``, just before it clears them.
    Its loguru output goes to the run's ``library.log`` (stderr with ``--verbose``).
    """
    import sys

    from llmcompressor.modifiers.transform.awq import AWQModifier
    from llmcompressor.utils.metric_logging import CompressionLogger
    from loguru import logger

    names = {id(module): name for name, module in model.named_modules()}
    errors: list[JsonValue] = []
    set_results = CompressionLogger.set_results
    log_awq = AWQModifier._log_error_metrics

    def on_results(self: CompressionLogger, name: str | None = None, loss: float | None = None) -> None:
        set_results(self, name=name, loss=loss)
        if loss is not None:
            errors.append({"module": names.get(id(self.module)), "method": name, "loss": float(loss)})

    def on_awq_metrics(self: AWQModifier) -> None:
        for item in self._error_metrics:
            errors.append(
                {
                    "module": str(item["layer_name"]),
                    "method": "AWQ",
                    "initial_error": float(item["initial_error"]),
                    "best_error": float(item["best_error"]),
                }
            )
        log_awq(self)

    if job.verbose:  # its console sink writes to stdout, quantkit's data channel: to stderr
        logger.remove()
        logger.add(sys.stderr, level="INFO")
    # without -v its log goes to the run's library.log (quantkit.util.library_log configured it)
    with (
        _patched(CompressionLogger, "set_results", on_results),
        _patched(AWQModifier, "_log_error_metrics", on_awq_metrics),
    ):
        yield errors


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


def source_dtype(folder: Path) -> torch.dtype:
    """The floating dtype most of a checkpoint's weights are stored in (its safetensors
    headers; config.json's ``dtype`` for .bin-only folders; float32 if neither says)."""
    import torch

    from quantkit.inputs.plan import stored_dtypes

    counts = stored_dtypes(folder)
    names = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    floating = {name: n for name, n in counts.items() if name in names}
    if floating:
        return names[max(floating, key=lambda name: floating[name])]
    from quantkit.inputs.models import read_config

    config = read_config(folder)
    declared = config.get("dtype") or config.get("torch_dtype")
    return getattr(torch, declared) if declared in ("float32", "float16", "bfloat16") else torch.float32


def keep_source_dtype(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Store what stays unquantized (embeddings, norms, an ignored head) in the source
    checkpoint's dtype: the model was computed in the device's dtype (fp32 on the CPU), which
    would otherwise double an fp16/bf16 source's embeddings on disk. Quantized modules (those
    carrying a ``quantization_scheme``) keep their weights for compression."""
    for module in model.modules():
        if getattr(module, "quantization_scheme", None) is not None:
            continue
        for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            if tensor.is_floating_point() and tensor.dtype != dtype:  # bf16 compute on CUDA too
                tensor.data = tensor.data.to(dtype)
    config = getattr(model, "config", None)
    if config is not None:
        config.dtype = dtype


def _import_llmcompressor() -> str:
    """llm-compressor's version, or the install hint when it is missing."""
    try:
        import llmcompressor
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            f"llm-compressor is not installed ({err.name})",
            "pip install 'quantkit[gptq]' (the gptq, awq and fp8 extras all install llm-compressor)",
        ) from None
    return str(llmcompressor.__version__)


def run_oneshot(
    job: QuantizeJob, recipe: OneshotRecipe, calibration: TokenWindows | None
) -> dict[str, JsonValue]:
    """Run llm-compressor's ``oneshot`` with ``recipe`` (modifier or list) into ``job.out_dir``."""
    version = _import_llmcompressor()
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
    names, errors = oneshot_in_place(job, model, recipe, calibration)
    job.log("saving the compressed-tensors checkpoint")
    keep_source_dtype(model, source_dtype(job.model_path))
    model.save_pretrained(job.out_dir, save_compressed=True)
    failpoint("save.weights")  # weights written, tokenizer not yet: a crash mid-save
    tokenizer.save_pretrained(job.out_dir)
    modifiers: list[JsonValue] = list(names)
    details: dict[str, JsonValue] = {
        "library": "llmcompressor",
        "library_version": version,
        "modifiers": modifiers,
        "layer_errors": errors,
    }
    if calibration is not None:
        details["calibration_fed_hash"] = fed_hash(_calibration_dataset(calibration)["input_ids"])
    return details


def fed_hash(rows: list[list[int]]) -> str:
    """The hash of the token ids a library was given (``hash_ids`` of the rows, no BOS rule):
    equal across engines exactly when they were fed the same ids."""
    import numpy as np

    from quantkit.inputs.tokens import hash_ids

    return hash_ids(np.asarray(rows, dtype=np.int32))


def oneshot_in_place(
    job: QuantizeJob, model: PreTrainedModel, recipe: OneshotRecipe, calibration: TokenWindows | None
) -> tuple[list[str], list[JsonValue]]:
    """llm-compressor's ``oneshot`` on a loaded ``model`` (on ``job.device``), in place, seeded
    with ``job.seed``, reporting each decoder layer to ``job.on_layer``; returns the modifiers'
    names and the per-module errors. Nothing is saved. llm-compressor reads the config and the
    tokenizer from ``model.config.name_or_path``: a model built from a config needs a folder
    holding both there."""
    _import_llmcompressor()
    import torch
    from llmcompressor import oneshot

    from quantkit.backends.llmcompressor_observer import layer_progress

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
    with (
        torch.random.fork_rng(devices=[]),
        _cpu_only_compat(),
        _llmcompressor_hooks(job, model) as errors,
        layer_progress(model, job.on_layer),
    ):
        torch.manual_seed(job.seed)  # the run's seed, without changing the caller's RNG state
        try:
            oneshot(model=model, recipe=recipe, **kwargs)
        except (RuntimeError, ValueError) as err:
            raise BackendError(
                f"llm-compressor failed: {str(err).splitlines()[0]}",
                "rerun with QUANTKIT_DEBUG=1 for the traceback",
            ) from err
    return names, errors
