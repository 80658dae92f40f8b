"""A toy runtime in one file, meeting the ``Runtime`` Protocol from scratch (no quantkit runtime
underneath): transformers' model and tokenizer, answering the scoring contract the way an
endpoint does (vLLM prompt log-probs, an OpenAI-compatible server): the target token's log-prob
and its own top-k, never the log-prob of an id it is asked about.

Registered by a test with one line: ``RUNTIMES.register("toy", "toy_runtime:TopKOnlyRuntime")``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from quantkit.runtimes.base import (
    DeviceMemory,
    Generation,
    LmEvalModel,
    OwnTokenizer,
    RuntimeSettings,
    ScoreRequest,
    Scores,
    scores_from_log_probs,
)
from quantkit.runtimes.hf import HFRuntime

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


class TopKOnlyRuntime:
    name: ClassVar[str] = "toy top-k only"
    scores_any_token: ClassVar[bool] = False
    batched_generation: ClassVar[bool] = False
    libraries: ClassVar[tuple[str, ...]] = ("torch", "transformers")

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
        self.model, self.tokenizer = model, tokenizer

    @classmethod
    def load(cls, path: Path, settings: RuntimeSettings) -> TopKOnlyRuntime:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        return cls(model, AutoTokenizer.from_pretrained(path))

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def bos_token_id(self) -> int | None:
        return self.tokenizer.bos_token_id

    @property
    def adds_bos(self) -> bool:
        ids = self.tokenizer("a").input_ids
        return bool(ids) and ids[0] == self.tokenizer.bos_token_id

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def score(self, request: ScoreRequest) -> Scores:
        import torch

        assert request.reference_ids is None, "a top-k-only runtime is never asked for ids"
        with torch.inference_mode():
            logits = self.model(input_ids=torch.as_tensor(request.ids)).logits.float()
        full = scores_from_log_probs(
            torch.log_softmax(logits, dim=-1), ScoreRequest(request.ids, request.top_k)
        )
        return Scores(  # what an endpoint returns: no residual mass, no asked-for ids
            target_logprobs=full.target_logprobs,
            topk_ids=full.topk_ids,
            topk_logprobs=full.topk_logprobs,
        )

    def generate(self, prompts: list[list[int]], new_tokens: int) -> Generation:
        import torch

        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model(input_ids=torch.as_tensor(prompts), use_cache=True)
            first = time.perf_counter() - start
            for _ in range(new_tokens - 1):
                token = out.logits[:, -1:].argmax(-1)
                out = self.model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)
        return Generation(first_token_s=first, total_s=time.perf_counter() - start)

    def device_memory(self) -> DeviceMemory | None:
        return None

    def close(self) -> None:
        del self.model

    @classmethod
    def lm_eval_model(cls, path: Path, settings: RuntimeSettings) -> LmEvalModel:
        raise NotImplementedError("the toy runtime has no lm-eval model")

    @classmethod
    def check_artifact(cls, path: Path) -> None:
        return None

    @classmethod
    def own_tokenizer(cls, path: Path) -> OwnTokenizer | None:
        return None


class TemperedRuntime(HFRuntime):
    """The same network with its logits tempered by ``scale`` (a controlled distortion)."""

    scale: ClassVar[float] = 1.0

    def score(self, request: ScoreRequest) -> Scores:
        import torch

        from quantkit.runtimes.base import scores_from_log_probs

        with torch.inference_mode():
            logits = self.model(input_ids=torch.as_tensor(request.ids)).logits.float()
        return scores_from_log_probs(torch.log_softmax(logits * self.scale, dim=-1), request)
