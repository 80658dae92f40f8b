"""An in-process lm-eval model over llama.cpp (GGUF), scoring log-likelihoods exactly.

lm-eval's own ``gguf`` model talks to a server whose echoed log-probs are off by one
position (llama-cpp-python issue #1983) and lacks rolling log-likelihood, so quantkit scores
through llama.cpp's logits directly, with lm-eval's context/continuation split.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lm_eval.api.model import LM


class LlamaCppLM(LM):
    """lm-eval ``LM`` backed by a GGUF file loaded in-process with all logits kept."""

    def __init__(self, path: Path, context_length: int = 2048, threads: int | None = None) -> None:
        super().__init__()
        from quantkit.runtimes.llamacpp import LlamaCppRuntime

        self.context_length = context_length
        self.runtime = LlamaCppRuntime(
            path, "cpu", context_length=context_length, threads=threads or os.cpu_count()
        )
        self.llm = self.runtime.model
        self.prefix_token_id = int(self.llm.token_bos())

    def _encode(self, text: str) -> list[int]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        spaces = len(context) - len(context.rstrip())
        if spaces:
            continuation, context = context[-spaces:] + continuation, context[:-spaces]
        whole = self._encode(context + continuation)
        context_ids = self._encode(context)
        return context_ids, whole[len(context_ids) :]

    def _score(self, context_ids: list[int], continuation_ids: list[int]) -> tuple[float, bool]:
        import numpy as np

        ids = (context_ids + continuation_ids)[-self.context_length :]
        n_cont = len(continuation_ids)
        self.llm.reset()
        self.llm.eval(ids)
        logits = np.asarray(self.llm.scores[: len(ids)], dtype=np.float64)
        rows = logits[len(ids) - n_cont - 1 : len(ids) - 1]
        log_probs = rows - np.logaddexp.reduce(rows, axis=-1, keepdims=True)
        picked = log_probs[np.arange(n_cont), continuation_ids]
        greedy = bool((rows.argmax(-1) == np.asarray(continuation_ids)).all())
        return float(picked.sum()), greedy

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        results = []
        for request in requests:
            context, continuation = request.args
            if context:
                context_ids, continuation_ids = self._encode_pair(context, continuation)
            else:
                context_ids, continuation_ids = [self.prefix_token_id], self._encode(continuation)
            results.append(self._score(context_ids, continuation_ids))
        return results

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Whole-document log-likelihood: disjoint scored windows, each with as much preceding
        context as fits (the first after the BOS/prefix token), as lm-eval's rolling windows."""
        totals = []
        window = self.context_length // 2
        for request in requests:
            ids = [self.prefix_token_id, *self._encode(request.args[0])]
            total = 0.0
            for start in range(1, len(ids), window):
                chunk = ids[start : start + window]
                context = ids[max(0, start - (self.context_length - len(chunk))) : start]
                score, _ = self._score(context, chunk)
                total += score
            totals.append(total)
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        raise NotImplementedError("generation tasks are not supported for GGUF artifacts yet")
