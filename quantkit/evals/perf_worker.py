"""Measure one model's speed and memory in a fresh process (run by quantkit.evals.perf).

Usage: python -m quantkit.evals.perf_worker SETTINGS_JSON -> prints one JSON line.
A fresh process per model makes load time and peak memory honest: nothing else is loaded.
"""

from __future__ import annotations

import importlib
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from quantkit.device import cpu_threads
from quantkit.evals.perf import WorkerSettings
from quantkit.results.manifest import BenchSide

if TYPE_CHECKING:
    from quantkit.runtimes.base import DeviceMemory, Runtime


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _peak_rss() -> int:
    """Peak RSS of this process image.

    On Linux this is ``VmHWM``: ``ru_maxrss`` survives fork+exec, so a worker started by a
    large quantize process would report its parent's peak instead of its own.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def _prompt(vocab: int, length: int, row: int = 0) -> list[int]:
    """A deterministic prompt of ordinary ids (clear of the special tokens at the low end)."""
    low = min(500, vocab // 4)
    return [low + (7919 * (i + 31 * row)) % (vocab - low - 1) for i in range(length)]


def _single_prompt_timings(
    model: Runtime, lengths: list[int], new_tokens: int, repeats: int
) -> tuple[dict[str, float], dict[str, float], float]:
    """Prefill tokens/s and time to first token per prompt length, and decode tokens/s (the
    median over lengths of each length's median over repeats)."""
    prefill: dict[str, float] = {}
    ttft: dict[str, float] = {}
    decode: list[float] = []
    for length in lengths:
        firsts, decodes = [], []
        for _ in range(repeats):
            timing = model.generate([_prompt(model.vocab_size, length)], new_tokens)
            firsts.append(timing.first_token_s)
            decodes.append((new_tokens - 1) / max(timing.total_s - timing.first_token_s, 1e-9))
        ttft[str(length)] = statistics.median(firsts)
        prefill[str(length)] = length / statistics.median(firsts)
        decode.append(statistics.median(decodes))
    return prefill, ttft, statistics.median(decode)


def _batched_decode(model: Runtime, length: int, new_tokens: int, repeats: int, batch: int) -> float | None:
    """Decode tokens/s summed over ``batch`` prompts at once (None: batch 1, or a runtime that
    generates one prompt at a time)."""
    if batch <= 1 or not type(model).batched_generation:
        return None
    totals = []
    for _ in range(repeats):
        prompts = [_prompt(model.vocab_size, length, row) for row in range(batch)]
        timing = model.generate(prompts, new_tokens)
        totals.append(batch * (new_tokens - 1) / max(timing.total_s - timing.first_token_s, 1e-9))
    return statistics.median(totals)


def measure(settings: WorkerSettings) -> BenchSide:
    """Load the model, warm up, and time prefill/decode (medians of repeats)."""
    from quantkit.runtimes import runtime_class
    from quantkit.runtimes.base import RuntimeSettings

    lengths = settings.prompt_lengths
    new_tokens, repeats = settings.decode_tokens, settings.repeats
    if settings.threads:
        import torch

        torch.set_num_threads(settings.threads)
    runtime_cls = runtime_class(settings.runtime)
    for library in runtime_cls.libraries:  # their own memory is not the model's
        importlib.import_module(library)
    before = _rss()
    start = time.perf_counter()
    model = runtime_cls.load(
        Path(settings.path),
        RuntimeSettings(
            device=settings.device,
            context_length=max(lengths) + new_tokens + 8,
            threads=settings.threads,
            scoring=False,
            dtype=settings.dtype,
        ),
    )
    load_s = time.perf_counter() - start
    model.generate([_prompt(model.vocab_size, 16)], 4)  # warm-up; also pages in mmap-loaded weights
    loaded = _rss()
    on_device = model.device_memory()  # the weights, when they live on an accelerator
    prefill, ttft, decode = _single_prompt_timings(model, lengths, new_tokens, repeats)
    batch = settings.batch_size
    batched = _batched_decode(model, lengths[0], new_tokens, repeats, batch)
    result = BenchSide(
        runtime=settings.runtime,
        path=settings.path,
        load_s=load_s,
        prefill_tok_s=prefill,
        ttft_s=ttft,
        decode_tok_s=decode,
        rss_before_load_bytes=before,
        weights_memory_bytes=max(loaded - before, 0),
        peak_memory_bytes=max(_peak_rss() - before, 0),
        memory_kind="rss",
        threads=settings.threads or cpu_threads(),
        batched_decode_tok_s=batched,
        batch_size=batch if batched is not None else None,
    )
    result = _with_device_memory(result, on_device, model.device_memory())
    model.close()
    return result


def _with_device_memory(
    result: BenchSide, weights: DeviceMemory | None, peak: DeviceMemory | None
) -> BenchSide:
    """On an accelerator, its memory (weights after loading, peak after the timings) replaces
    the process's RSS."""
    if weights is None or peak is None:
        return result
    return result.model_copy(
        update={
            "memory_kind": "cuda",
            "weights_memory_bytes": weights.allocated_bytes,
            "peak_memory_bytes": peak.peak_allocated_bytes,
            "peak_allocated_bytes": peak.peak_allocated_bytes,
            "peak_reserved_bytes": peak.peak_reserved_bytes,
        }
    )


def main() -> None:
    settings = WorkerSettings.model_validate_json(sys.argv[1])
    from quantkit.util.progress import native_stderr_captured, quiet_libraries

    quiet_libraries(True)  # everything to stderr, which the parent adds to its library log
    with native_stderr_captured(verbose=True):
        result = measure(settings)
    sys.stdout.write(result.model_dump_json() + "\n")


if __name__ == "__main__":
    main()
