"""Shared driver for llm-compressor backends: load, ``oneshot``, save compressed-tensors."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quantkit.errors import BackendError, MissingDependencyError

if TYPE_CHECKING:
    from quantkit.backends.base import QuantizeJob
    from quantkit.calibration import TokenWindows


def _calibration_dataset(windows: TokenWindows) -> Any:
    from datasets import Dataset

    ids = [list(map(int, row)) for row in windows.ids]
    return Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(r) for r in ids]})


def run_oneshot(job: QuantizeJob, modifier: Any, calibration: TokenWindows | None) -> dict[str, Any]:
    """Run llm-compressor's ``oneshot`` with ``modifier`` and save into ``job.out_dir``."""
    try:
        import llmcompressor
        from llmcompressor import oneshot
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            f"llm-compressor is not installed ({err.name})", "pip install 'quantkit[llmcompressor]'"
        ) from None
    import torch
    from loguru import logger
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quantkit.runtimes.hf import torch_dtype_for

    if not job.verbose:  # llmcompressor re-enables its loguru logger on import
        logger.disable("llmcompressor")
        logger.disable("compressed_tensors")
    torch.manual_seed(job.seed)
    job.log("loading the model for quantization")
    model: Any = AutoModelForCausalLM.from_pretrained(
        job.model_path,
        dtype=torch_dtype_for(job.device),
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
    job.log(f"running llm-compressor oneshot ({type(modifier).__name__})")
    try:
        oneshot(model=model, recipe=modifier, **kwargs)
    except (RuntimeError, ValueError) as err:
        raise BackendError(
            f"llm-compressor failed: {str(err).splitlines()[0]}",
            "rerun with QUANTKIT_DEBUG=1 for the traceback",
        ) from err
    job.log("saving the compressed-tensors checkpoint")
    model.save_pretrained(job.out_dir, save_compressed=True)
    tokenizer.save_pretrained(job.out_dir)
    return {"library": "llmcompressor", "library_version": llmcompressor.__version__}
