"""An lm-eval model over any quantkit runtime, scoring log-likelihoods through ``Runtime.score``.

lm-eval's own ``gguf`` model talks to a server whose echoed log-probs are off by one
position (llama-cpp-python issue #1983) and lacks rolling log-likelihood, so quantkit scores
in-process through the runtime's scoring contract, with lm-eval's context/continuation
split: the log-likelihood of a continuation is the sum of the target log-probs over its
positions, and it is greedy when the runtime's own top-1 is the continuation token at each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lm_eval.api.model import LM

if TYPE_CHECKING:
    from lm_eval.api.instance import Instance

    from quantkit.runtimes.base import Runtime


class RuntimeLM(LM):
    """lm-eval ``LM`` backed by a loaded quantkit runtime (llama.cpp for GGUF, or any other)."""

    def __init__(self, runtime: Runtime, context_length: int = 2048) -> None:
        super().__init__()
        self.runtime = runtime
        self.context_length = context_length
        bos = runtime.bos_token_id
        self.prefix_token_id = 0 if bos is None else bos

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        spaces = len(context) - len(context.rstrip())
        if spaces:
            continuation, context = context[-spaces:] + continuation, context[:-spaces]
        whole = self.runtime.tokenize(context + continuation)
        context_ids = self.runtime.tokenize(context)
        lead = [self.prefix_token_id] if self.runtime.adds_bos else []  # lm-eval's add_bos_token
        return lead + context_ids, whole[len(context_ids) :]

    def _score(self, context_ids: list[int], continuation_ids: list[int]) -> tuple[float, bool]:
        import numpy as np

        from quantkit.runtimes.base import ScoreRequest

        ids = (context_ids + continuation_ids)[-self.context_length :]
        n_cont = len(continuation_ids)
        scores = self.runtime.score(ScoreRequest(ids=np.asarray([ids], dtype=np.int64), top_k=1))
        # position t of the scores predicts token t + 1
        target = scores.target_logprobs[0, len(ids) - n_cont - 1 :].astype(np.float64)
        greedy = scores.topk_ids[0, len(ids) - n_cont - 1 :, 0]
        return float(target.sum()), bool((greedy == np.asarray(ids[-n_cont:])).all())

    def loglikelihood(self, requests: list[Instance], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        results = []
        for request in requests:
            context, continuation = request.args
            if context:
                context_ids, continuation_ids = self._encode_pair(context, continuation)
            else:
                context_ids, continuation_ids = [self.prefix_token_id], self.runtime.tokenize(continuation)
            results.append(self._score(context_ids, continuation_ids))
        return results

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        """Whole-document log-likelihood: disjoint scored windows, each with as much preceding
        context as fits (the first after the BOS/prefix token), as lm-eval's rolling windows."""
        totals = []
        window = self.context_length // 2
        for request in requests:
            ids = [self.prefix_token_id, *self.runtime.tokenize(request.args[0])]
            total = 0.0
            for start in range(1, len(ids), window):
                chunk = ids[start : start + window]
                context = ids[max(0, start - (self.context_length - len(chunk))) : start]
                score, _ = self._score(context, chunk)
                total += score
            totals.append(total)
        return totals

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        raise NotImplementedError("generation tasks are not supported through quantkit runtimes yet")
