"""Shared driver for the GPTQModel engine: load, ``quantize`` on quantkit's calibration ids, save
the GPTQ checkpoint format (which transformers loads through optimum and GPTQModel's kernels)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from quantkit.errors import BackendError, MissingDependencyError

if TYPE_CHECKING:
    from pathlib import Path

    import torch
    from pydantic import JsonValue
    from transformers import PretrainedConfig

    from quantkit.backends.base import QuantizeJob
    from quantkit.inputs.tokens import TokenWindows

INSTALL_HINT = "pip install 'quantkit[gptqmodel]'"


def gptqmodel_version() -> str:
    """GPTQModel's installed version, or a MissingDependencyError naming the extra. Reads the
    package metadata and the import machinery only: importing GPTQModel takes seconds."""
    from quantkit.util.environment import installed_version

    version = installed_version("gptqmodel", "gptqmodel")
    if version is None:
        raise MissingDependencyError("GPTQModel is not installed (options.engine: gptqmodel)", INSTALL_HINT)
    return version


@contextmanager
def _logs_in(folder: Path) -> Iterator[None]:
    """GPTQModel writes per-run log files into ``./logs`` of the working directory; keep them in
    ``folder`` (a scratch folder the caller removes)."""
    from gptqmodel.looper import loop_processor

    original = loop_processor._PROJECT_LOG_DIR
    loop_processor._PROJECT_LOG_DIR = folder
    try:
        yield
    finally:
        loop_processor._PROJECT_LOG_DIR = original


def _ensure_cpu_workers() -> None:
    """GPTQModel 7.6 sizes its CPU pool at half the cores but asks for 2 model-loader workers
    from it, which raises on a 1-2 core machine ("requests 2 workers but parent 'cpu' only has
    1"): give the pool at least 2 unless the user chose (``GPTQMODEL_CPU_WORKERS``)."""
    cores = os.cpu_count() or 1
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(max(2, (cores + 1) // 2)))


class _LayerProgress:
    """GPTQModel's subset callback: each decoder layer's first forward is reported as that
    layer being worked on (its own event, not its log text)."""

    def __init__(self, job: QuantizeJob) -> None:
        self._job = job
        self._last = -1

    def subset_event(self, *, stage: str, layer_idx: int, **event: object) -> None:
        if stage == "forward_start" and layer_idx != self._last:
            self._last = layer_idx
            self._job.on_layer(layer_idx)


def calibration_rows(windows: TokenWindows) -> list[dict[str, list[int]]]:
    """quantkit's calibration windows as GPTQModel's tokenized examples (no padding: every
    window is ``seq_len`` tokens)."""
    return [{"input_ids": [int(x) for x in row], "attention_mask": [1] * len(row)} for row in windows.ids]


def layer_errors(stats: object, layers_node: str) -> list[JsonValue]:
    """Per-module GPTQ losses from the result ``quantize`` returns (``{"gptq": [row, ...]}``,
    one row per quantized module with its layer index, module name, loss, samples and damp)."""
    rows = stats.get("gptq", []) if isinstance(stats, dict) else []
    errors: list[JsonValue] = []
    for row in rows:
        if not isinstance(row, dict) or row.get("loss") in (None, ""):
            continue
        errors.append(
            {
                "module": f"{layers_node}.{row['layer']}.{row['module']}",
                "method": "GPTQ",
                "loss": float(row["loss"]),
                "samples": int(row["samples"]),
                "damp": float(row["damp"]),
            }
        )
    return errors


def store_unquantized_in(folder: Path, dtype: torch.dtype) -> None:
    """Rewrite the saved checkpoint so what GPTQModel left unquantized (embeddings, norms, the
    head) is stored in the source checkpoint's dtype, as the llm-compressor engine stores it:
    the model was computed in float32 on the CPU. The packed tensors (int32 ``qweight``,
    ``qzeros``, ``g_idx``; fp16 ``scales``) are left as they are. Done on the files, after
    ``save``: GPTQModel offloads finished layers to disk while it quantizes, so the modules in
    memory do not all hold their tensors."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            metadata = handle.metadata()
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
        changed = {
            name: tensor.to(dtype)
            for name, tensor in tensors.items()
            if tensor.is_floating_point() and tensor.dtype != dtype and not name.endswith(".scales")
        }
        if changed:
            save_file(tensors | changed, str(path), metadata=metadata)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["dtype"] = str(dtype).removeprefix("torch.")
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def restore_rope_parameters(config: PretrainedConfig, job: QuantizeJob) -> None:
    """Put the source model's RoPE parameters back on ``config`` (the model GPTQModel loaded).

    GPTQModel 7.6 registers a ``"default"`` RoPE initializer for transformers 5 that calls
    ``standardize_rope_params`` while the model is built; on a config with one RoPE entry per
    layer type (Gemma 3: ``sliding_attention``, ``full_attention``) that adds top-level
    ``rope_type``/``rope_theta`` beside the entries, and transformers then refuses to save the
    config. The rotary embeddings are computed from the per-layer entries before that, so only the
    saved config needs the repair."""
    from transformers import AutoConfig

    source = AutoConfig.from_pretrained(str(job.model_path), trust_remote_code=job.trust_remote_code)
    source = source.get_text_config() if hasattr(source, "get_text_config") else source
    wanted = getattr(source, "rope_parameters", None)
    if wanted is not None and getattr(config, "rope_parameters", None) != wanted:
        config.rope_parameters = wanted


def run_gptqmodel(job: QuantizeJob, quantize_config: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """Quantize ``job.model_path`` with GPTQModel (``quantize_config``: its QuantizeConfig's
    fields) on ``job.calibration``'s ids into ``job.out_dir``; the artifact's details."""
    import tempfile
    from pathlib import Path

    from quantkit.util.progress import stdout_to_stderr

    version = gptqmodel_version()
    if job.calibration is None:  # pragma: no cover - the recipe requires calibration
        raise BackendError("GPTQ needs calibration tokens", "remove 'calibration: null' from the recipe")
    _ensure_cpu_workers()
    with (
        tempfile.TemporaryDirectory(prefix="quantkit-gptqmodel-") as scratch,
        stdout_to_stderr(drop=not job.verbose),  # GPTQModel prints its banner and logs on stdout
        _logs_in(Path(scratch)),
    ):
        return _quantize_and_save(job, quantize_config, job.calibration) | {"library_version": version}


def _quantize_and_save(
    job: QuantizeJob, quantize_config: dict[str, JsonValue], calibration: TokenWindows
) -> dict[str, JsonValue]:
    import torch
    from gptqmodel import GPTQModel, QuantizeConfig

    from quantkit.backends.llmcompressor_run import fed_hash, source_dtype
    from quantkit.device import compute_dtype

    job.log("loading the model for quantization (GPTQModel)")
    config = QuantizeConfig(**quantize_config, device=job.device)
    model = GPTQModel.load(
        str(job.model_path), config, dtype=compute_dtype(job.device), trust_remote_code=job.trust_remote_code
    )
    model.subset_callback = _LayerProgress(job)
    rows = calibration_rows(calibration)
    job.log(f"running GPTQModel quantize ({len(rows)} x {calibration.seq_len} tokens)")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(job.seed)
        try:
            stats = model.quantize(rows, calibration_sort=None, batch_size=1)
        except (RuntimeError, ValueError, AttributeError) as err:
            raise BackendError(
                f"GPTQModel failed: {str(err).splitlines()[0]}",
                "rerun with QUANTKIT_DEBUG=1 for the traceback",
            ) from err
    job.log("saving the GPTQ checkpoint")
    restore_rope_parameters(model.model.config, job)
    model.save(str(job.out_dir))
    store_unquantized_in(job.out_dir, source_dtype(job.model_path))
    return {
        "library": "gptqmodel",
        "engine": "gptqmodel",
        "checkpoint_format": "gptq",
        "calibration_fed_hash": fed_hash([row["input_ids"] for row in rows]),
        "layer_errors": layer_errors(stats, type(model).extract_layers_node()[0]),
    }
