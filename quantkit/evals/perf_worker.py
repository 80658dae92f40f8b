"""Measure one model's speed and memory in a fresh process (run by quantkit.evals.perf).

Usage: python -m quantkit.evals.perf_worker SETTINGS_JSON -> prints one JSON line.
A fresh process per model makes load time and peak memory honest: nothing else is loaded.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any


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


class _HF:
    def __init__(self, path: Path, device: str) -> None:
        import torch

        from quantkit.runtimes.hf import HFRuntime

        self.torch = torch
        self.device = device
        self.runtime = HFRuntime(path, device)
        self.vocab = int(self.runtime.model.config.vocab_size)

    def sync(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def generate(self, prompts: list[list[int]], new_tokens: int) -> tuple[float, float]:
        """Greedy decoding with the KV cache: (time to first token, total time)."""
        torch = self.torch
        model = self.runtime.model
        ids = torch.tensor(prompts, device=self.device)
        with torch.inference_mode():
            self.sync()
            start = time.perf_counter()
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)  # as a server would
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            self.sync()
            first = time.perf_counter() - start
            past = out.past_key_values
            for _ in range(new_tokens - 1):
                out = model(input_ids=token, past_key_values=past, use_cache=True)
                past = out.past_key_values
                token = out.logits[:, -1].argmax(-1, keepdim=True)
            self.sync()
            return first, time.perf_counter() - start

    def memory(self) -> dict[str, Any]:
        if self.device != "cuda":
            return {}
        torch = self.torch
        return {
            "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
        }


class _LlamaCpp:
    def __init__(self, path: Path, device: str, context: int) -> None:
        from quantkit.runtimes.llamacpp import LlamaCppRuntime

        self.runtime = LlamaCppRuntime(path, device, context_length=context, logits_all=False)
        self.vocab = int(self.runtime.model.n_vocab())

    def generate(self, prompts: list[list[int]], new_tokens: int) -> tuple[float, float]:
        import numpy as np

        if len(prompts) != 1:
            raise ValueError("llama.cpp runtime measures batch 1 only")
        llm = self.runtime.model
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompts[0])
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        first = time.perf_counter() - start
        for _ in range(new_tokens - 1):
            llm.eval([token])
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        return first, time.perf_counter() - start

    def memory(self) -> dict[str, Any]:
        return {}


def measure(settings: dict[str, Any]) -> dict[str, Any]:
    """Load the model, warm up, and time prefill/decode (medians of repeats)."""
    path = Path(settings["path"])
    device = settings["device"]
    lengths = [int(n) for n in settings["prompt_lengths"]]
    new_tokens = int(settings["decode_tokens"])
    repeats = int(settings["repeats"])
    if settings.get("threads"):
        import torch

        torch.set_num_threads(int(settings["threads"]))
    # import the runtime's libraries first: their own memory is not the model's
    if settings["runtime"] == "llamacpp":
        import llama_cpp  # noqa: F401
    else:
        import torch
        import transformers  # noqa: F401

        from quantkit.runtimes import hf  # noqa: F401
    before = _rss()
    start = time.perf_counter()
    if settings["runtime"] == "llamacpp":
        model: Any = _LlamaCpp(path, device, max(lengths) + new_tokens + 8)
    else:
        model = _HF(path, device)
    load_s = time.perf_counter() - start
    model.generate([_prompt(model.vocab, 16)], 4)  # warm-up; also pages in mmap-loaded weights
    loaded = _rss()
    prefill: dict[str, float] = {}
    ttft: dict[str, float] = {}
    decode: list[float] = []
    for length in lengths:
        firsts, decodes = [], []
        for _ in range(repeats):
            first, total = model.generate([_prompt(model.vocab, length)], new_tokens)
            firsts.append(first)
            decodes.append((new_tokens - 1) / max(total - first, 1e-9))
        ttft[str(length)] = statistics.median(firsts)
        prefill[str(length)] = length / statistics.median(firsts)
        decode.append(statistics.median(decodes))
    result: dict[str, Any] = {
        "runtime": settings["runtime"],
        "load_s": load_s,
        "prefill_tok_s": prefill,
        "ttft_s": ttft,
        "decode_tok_s": statistics.median(decode),
        "rss_before_load_bytes": before,
        "weights_memory_bytes": max(loaded - before, 0),
        "peak_memory_bytes": max(_peak_rss() - before, 0),
        "memory_kind": "rss",
        "threads": settings.get("threads") or os.cpu_count(),
    }
    batch = int(settings.get("batch_size") or 1)
    if batch > 1 and settings["runtime"] != "llamacpp":
        length = lengths[0]
        totals = []
        for _ in range(repeats):
            first, total = model.generate(
                [_prompt(model.vocab, length, row) for row in range(batch)], new_tokens
            )
            totals.append(batch * (new_tokens - 1) / max(total - first, 1e-9))
        result["batched_decode_tok_s"] = statistics.median(totals)
        result["batch_size"] = batch
    gpu = model.memory()
    if gpu:
        result |= {"memory_kind": "cuda", "peak_memory_bytes": gpu["peak_allocated_bytes"]} | gpu
    return result


def main() -> None:
    settings = json.loads(sys.argv[1])
    from quantkit.progress import native_stderr_captured, quiet_libraries

    quiet_libraries(False)
    with native_stderr_captured(verbose=False):
        result = measure(settings)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
