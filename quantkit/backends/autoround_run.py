"""Driver for AutoRound (intel/auto-round): load the model, tune it on quantkit's calibration ids,
export the requested format, and record what it was fed and what it reported per block."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from quantkit.errors import BackendError, MissingDependencyError
from quantkit.util.library_log import LIBRARY_LOG

if TYPE_CHECKING:
    from pathlib import Path

    import torch
    from pydantic import JsonValue
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from quantkit.backends.base import QuantizeJob
    from quantkit.inputs.tokens import TokenWindows

INSTALL_HINT = "pip install 'quantkit[autoround]'"


def autoround_version() -> str:
    """AutoRound's installed version, or a MissingDependencyError naming the extra. Reads the
    package metadata and the import machinery only (importing AutoRound imports torch)."""
    from quantkit.util.environment import installed_version

    version = installed_version("auto_round", "auto-round")
    if version is None:
        raise MissingDependencyError("AutoRound is not installed (method: autoround)", INSTALL_HINT)
    return version


class BlockRecorder:
    """AutoRound's own per-block results, from its SignRound quantizer's methods (not its log
    text): each block's index as it starts (progress), and the loss its ``_get_loss`` returned
    on every batch, grouped into tuning steps by its ``_step`` calls. The loss is the mean
    squared error between the block's quantized and full-precision outputs."""

    def __init__(self, job: QuantizeJob, block_names: list[str]) -> None:
        self._job = job
        self._names = block_names
        self.rows: list[JsonValue] = []
        self._steps: list[list[float]] = []

    def start(self, index: int) -> None:
        self._job.on_layer(index)
        self._steps = [[]]

    def loss(self, value: float) -> None:
        self._steps[-1].append(value)

    def step(self) -> None:
        self._steps.append([])

    def finish(self, index: int) -> None:
        steps = [sum(batch) / len(batch) for batch in self._steps if batch]
        if not steps:
            return
        best = min(range(len(steps)), key=steps.__getitem__)
        name = self._names[index] if index < len(self._names) else str(index)
        self.rows.append(
            {
                "module": name,
                "method": "AutoRound",
                "initial_loss": steps[0],
                "best_loss": steps[best],
                "best_iter": best,
                "iters": len(steps),
            }
        )


@contextmanager
def _recording(recorder: BlockRecorder) -> Iterator[None]:
    """Route the SignRound quantizer's block, loss and step methods through ``recorder``."""
    import inspect

    from auto_round.algorithms.quantization.sign_round.quantizer import SignRoundQuantizer

    quantize_block = SignRoundQuantizer.quantize_block
    get_loss = SignRoundQuantizer._get_loss
    step = SignRoundQuantizer._step

    signature = inspect.signature(quantize_block)

    def on_block(self: SignRoundQuantizer, block: object, *args: object, **kwargs: object) -> object:
        # AutoRound's composer passes the block context positionally
        context = signature.bind(self, block, *args, **kwargs).arguments.get("block_ctx")
        index = int(getattr(context, "block_index", 0))
        recorder.start(index)
        result = quantize_block(self, block, *args, **kwargs)
        recorder.finish(index)
        return result

    def on_loss(self: SignRoundQuantizer, *args: object, **kwargs: object) -> torch.Tensor:
        loss = get_loss(self, *args, **kwargs)
        recorder.loss(float(loss.detach()))
        return loss

    def on_step(self: SignRoundQuantizer, *args: object, **kwargs: object) -> object:
        recorder.step()
        return step(self, *args, **kwargs)

    SignRoundQuantizer.quantize_block = on_block
    SignRoundQuantizer._get_loss = on_loss
    SignRoundQuantizer._step = on_step
    try:
        yield
    finally:
        SignRoundQuantizer.quantize_block = quantize_block
        SignRoundQuantizer._get_loss = get_loss
        SignRoundQuantizer._step = step


@contextmanager
def _environment(scratch: Path, verbose: bool) -> Iterator[None]:
    """AutoRound's working folder (it offloads finished blocks there) in ``scratch``, its GGUF
    converter the one it bundles (no download), its log quiet unless ``verbose``."""
    import logging

    keys = ("AR_WORK_SPACE", "AUTO_ROUND_GGUF_AUTO_UPDATE", "AR_LOG_LEVEL")
    saved = {key: os.environ.get(key) for key in keys}
    # AutoRound lower-cases AR_WORK_SPACE: a path with capitals would land elsewhere
    os.environ["AR_WORK_SPACE"] = str(scratch) if str(scratch) == str(scratch).lower() else "."
    os.environ["AUTO_ROUND_GGUF_AUTO_UPDATE"] = "0"
    os.environ["AR_LOG_LEVEL"] = "INFO" if verbose else "WARNING"  # read when auto_round is imported
    import auto_round.logger  # noqa: F401 - sets its logger's level from AR_LOG_LEVEL

    LIBRARY_LOG.adopt()  # its warnings to the run's library.log (the terminal with -v)
    logger = logging.getLogger("autoround")
    level = logger.level
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_autoround(job: QuantizeJob, options: dict[str, JsonValue], fmt: str) -> dict[str, JsonValue]:
    """Quantize ``job.model_path`` with AutoRound (``options``: its keyword arguments) on
    ``job.calibration``'s ids and export ``fmt`` into ``job.out_dir``; the artifact's details."""
    import tempfile
    from pathlib import Path

    from quantkit.util.progress import stdout_to_stderr

    version = autoround_version()
    if job.calibration is None:  # pragma: no cover - the recipe requires calibration
        raise BackendError("AutoRound needs calibration tokens", "remove 'calibration: null' from the recipe")
    with (
        tempfile.TemporaryDirectory(prefix="quantkit-autoround-") as scratch,
        stdout_to_stderr(drop=not job.verbose),
        _environment(Path(scratch), job.verbose),
    ):
        details = _quantize_and_export(job, options, fmt, job.calibration, Path(scratch))
    return details | {"library_version": version}


FEW_ITERS = 50  # AutoRound's light preset: 50 steps at lr 5e-3


def _rate(options: dict[str, JsonValue]) -> tuple[int, float | None]:
    """The tuning steps and the rounding learning rate AutoRound uses: ``lr``, or its rule
    (SignRoundConfig's: 1/iters; 2/iters from 1000 steps at 3 bits or fewer; none at iters 0,
    its RTN mode)."""
    iters = int(str(options.get("iters") or 0))
    lr, bits = options.get("lr"), options.get("bits")
    if isinstance(lr, (int, float)):
        return iters, float(lr)
    if iters <= 0:
        return iters, None
    low_bits = isinstance(bits, int) and bits <= 3
    return iters, (2.0 if iters >= 1000 and low_bits else 1.0) / iters


def few_iters_note(options: dict[str, JsonValue]) -> str | None:
    """A note when AutoRound's default learning rate (1/iters) is a large step: few iters and
    no ``lr`` set (at 4 steps it made SmolLM2's W4 rounding worse than none)."""
    iters, lr = _rate(options)
    if lr is None or options.get("lr") is not None or iters >= FEW_ITERS:
        return None
    return (
        f"note: lr = 1/iters = {lr:g} is a large step at {iters} iters and can make the rounding worse"
        " than none (docs/recipes.md); set options.lr, e.g. 0.005-0.01"
    )


def _fed_ids(model: torch.nn.Module, fed: list[list[int]]) -> torch.utils.hooks.RemovableHandle:
    """Record the token ids every forward of the whole model is given (AutoRound runs the model
    only to capture the first block's inputs: these are the calibration ids it used)."""
    import torch

    def record(module: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if isinstance(ids, torch.Tensor):
            fed.extend([[int(x) for x in row] for row in ids.reshape(-1, ids.shape[-1]).tolist()])

    return model.register_forward_pre_hook(record, with_kwargs=True)


def _quantize_and_export(
    job: QuantizeJob, options: dict[str, JsonValue], fmt: str, calibration: TokenWindows, scratch: Path
) -> dict[str, JsonValue]:
    import re

    import torch
    from auto_round import AutoRound

    from quantkit.backends.llmcompressor_run import fed_hash

    model, tokenizer = _load_for_autoround(job)
    rows = [torch.as_tensor(row, dtype=torch.long).reshape(1, -1) for row in calibration.ids]
    blocks = [name for name, _ in model.named_modules() if re.fullmatch(r"(.+\.)?layers\.\d+", name)]
    recorder = BlockRecorder(job, blocks[:: int(str(options.get("nblocks") or 1))])
    fed: list[list[int]] = []
    handle = _fed_ids(model, fed)
    scheme = {"scheme": fmt.upper()} if fmt.startswith("gguf:") else {}
    iters, lr = _rate(options)
    job.log(f"running AutoRound ({len(rows)} x {calibration.seq_len} tokens, {iters} iters)")
    note = few_iters_note(options)
    if note:
        job.log(note)
    with torch.random.fork_rng(devices=[]), _recording(recorder):
        torch.manual_seed(job.seed)
        try:
            rounder = AutoRound(
                model,
                tokenizer=tokenizer,
                dataset=rows,
                nsamples=len(rows),
                seqlen=calibration.seq_len,
                seed=job.seed,
                device_map=job.device,
                format=fmt,
                **scheme,
                **options,
            )
            folders = rounder.quantize_and_save(str(scratch / "export"))[1]
        except (RuntimeError, ValueError, NotImplementedError, AssertionError) as err:
            raise BackendError(
                f"AutoRound failed: {str(err).splitlines()[0] if str(err) else type(err).__name__}",
                "rerun with QUANTKIT_DEBUG=1 for the traceback",
            ) from err
        finally:
            handle.remove()
    _move_export(job, folders, fmt, tokenizer)
    return {
        "library": "auto-round",
        "engine": "autoround",
        "export_format": fmt,
        "calibration_fed_hash": fed_hash(fed),
        "calibration_fed_rows": len(fed),
        "seed": job.seed,
        "iters": iters,
        "lr": lr,
        "layer_errors": recorder.rows,
    }


def _load_for_autoround(job: QuantizeJob) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The source model in the device's compute precision, and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quantkit.device import compute_dtype

    job.log("loading the model for quantization (AutoRound)")
    model = AutoModelForCausalLM.from_pretrained(
        job.model_path, dtype=compute_dtype(job.device), trust_remote_code=job.trust_remote_code
    )
    tokenizer = AutoTokenizer.from_pretrained(job.model_path, trust_remote_code=job.trust_remote_code)
    return model, tokenizer


def _move_export(job: QuantizeJob, folders: object, fmt: str, tokenizer: object) -> None:
    """Move what AutoRound saved (a folder it names after the model and scheme) into
    ``job.out_dir``: the GGUF file as ``model.gguf``; a checkpoint folder as it is, with what
    stayed unquantized stored in the source's dtype, and the tokenizer."""
    import shutil
    from pathlib import Path

    from quantkit.backends.gptqmodel_run import store_unquantized_in
    from quantkit.backends.llmcompressor_run import source_dtype

    saved = [Path(str(folder)) for folder in (folders if isinstance(folders, list) else [folders])]
    saved = [folder for folder in saved if folder.is_dir()]
    if not saved:
        raise BackendError(f"AutoRound saved no {fmt} output", "rerun with --verbose")
    job.out_dir.mkdir(parents=True, exist_ok=True)
    if fmt.startswith("gguf:"):
        files = sorted(saved[0].glob("*.gguf"))
        if len(files) != 1:
            raise BackendError(f"AutoRound's {fmt} export holds {len(files)} .gguf files", "rerun --verbose")
        shutil.move(str(files[0]), job.out_dir / "model.gguf")
        return
    for item in saved[0].iterdir():
        shutil.move(str(item), job.out_dir / item.name)
    store_unquantized_in(job.out_dir, source_dtype(job.model_path))
    tokenizer.save_pretrained(job.out_dir)  # type: ignore[attr-defined]
