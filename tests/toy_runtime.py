"""A toy runtime in one file: transformers underneath, but it answers the scoring contract the
way an endpoint does (vLLM prompt log-probs, an OpenAI-compatible server): the target token's
log-prob and its own top-k, never the log-prob of an id it is asked about.

Registered by a test with one line: ``RUNTIMES.register("toy", "toy_runtime:TopKOnlyRuntime")``.
"""

from __future__ import annotations

from typing import ClassVar

from quantkit.runtimes.base import ScoreRequest, Scores
from quantkit.runtimes.hf import HFRuntime


class TopKOnlyRuntime(HFRuntime):
    name: ClassVar[str] = "toy top-k only"
    scores_any_token: ClassVar[bool] = False

    def score(self, request: ScoreRequest) -> Scores:
        assert request.reference_ids is None, "a top-k-only runtime is never asked for ids"
        full = super().score(request)
        return Scores(  # what an endpoint returns: no residual mass, no asked-for ids
            target_logprobs=full.target_logprobs,
            topk_ids=full.topk_ids,
            topk_logprobs=full.topk_logprobs,
        )


class TemperedRuntime(HFRuntime):
    """The same network with its logits tempered by ``scale`` (a controlled distortion)."""

    scale: ClassVar[float] = 1.0

    def score(self, request: ScoreRequest) -> Scores:
        import torch

        from quantkit.runtimes.base import scores_from_log_probs

        with torch.inference_mode():
            logits = self.model(input_ids=torch.as_tensor(request.ids)).logits.float()
        return scores_from_log_probs(torch.log_softmax(logits * self.scale, dim=-1), request)
