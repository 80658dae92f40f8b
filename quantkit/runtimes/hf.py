"""The transformers runtime: an HF folder (plain or compressed-tensors), scored and timed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from quantkit.runtimes.base import (
    DeviceMemory,
    Generation,
    LmEvalModel,
    Runtime,
    RuntimeSettings,
    ScoreRequest,
    Scores,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from typing_extensions import Self

    from quantkit.jsontypes import JsonDict

_LOGIT_ELEMENTS = 1 << 28  # float32 logits one forward pass may make (1 GiB)


class HFRuntime(Runtime):
    """A causal LM loaded with transformers in the run's baseline precision (``settings.dtype``)."""

    name: ClassVar[str] = "transformers"
    scores_any_token: ClassVar[bool] = True
    batched_generation: ClassVar[bool] = True
    libraries: ClassVar[tuple[str, ...]] = ("torch", "transformers")

    def __init__(self, model: PreTrainedModel, path: Path, settings: RuntimeSettings) -> None:
        self.model = model
        self.path = path
        self.settings = settings
        self._tokenizer: PreTrainedTokenizerBase | None = None

    @classmethod
    def load(cls, path: Path, settings: RuntimeSettings) -> Self:
        from transformers import AutoModelForCausalLM

        from quantkit.device import torch_dtype
        from quantkit.util.progress import stdout_to_stderr

        with stdout_to_stderr():  # a GPTQ checkpoint loads through GPTQModel, which prints on stdout
            model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
                path, dtype=torch_dtype(settings.compute_dtype), trust_remote_code=settings.trust_remote_code
            )
        model = model.to(settings.device)  # type: ignore[arg-type]  # transformers' stub wraps .to
        model.eval()
        return cls(model, path, settings)

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(
                self.path, trust_remote_code=self.settings.trust_remote_code
            )
        return self._tokenizer

    @property
    def bos_token_id(self) -> int | None:
        token = self.tokenizer.bos_token_id
        return None if token is None else int(token)

    @property
    def adds_bos(self) -> bool:
        from quantkit.inputs.special_tokens import tokenizer_bos

        return tokenizer_bos(self.tokenizer) is not None

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def score(self, request: ScoreRequest) -> Scores:
        import torch

        from quantkit.runtimes.base import scores_from_logits

        ids = torch.as_tensor(request.ids, dtype=torch.long).to(self.settings.device)
        # windows per forward pass: at most ~1 GiB of float32 logits (Gemma 3's 262k vocabulary
        # makes 2.1 GB for 4 x 512 tokens)
        per_pass = max(
            1, _LOGIT_ELEMENTS // (ids.shape[1] * int(self.model.config.get_text_config().vocab_size))
        )

        def rows() -> Iterator[torch.Tensor]:
            for start in range(0, len(ids), per_pass):
                with torch.inference_mode():
                    logits = self.model(input_ids=ids[start : start + per_pass]).logits.cpu()
                yield from logits

        with torch.inference_mode():
            return scores_from_logits(rows(), request)

    def _sync(self) -> None:
        if self.settings.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def generate(self, prompts: list[list[int]], new_tokens: int) -> Generation:
        """Greedy decoding with the KV cache, as a server would (only the last logits kept)."""
        import torch

        ids = torch.tensor(prompts, device=self.settings.device)
        with torch.inference_mode():
            self._sync()
            start = time.perf_counter()
            out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            self._sync()
            first = time.perf_counter() - start
            past = out.past_key_values
            for _ in range(new_tokens - 1):
                out = self.model(input_ids=token, past_key_values=past, use_cache=True)
                past = out.past_key_values
                token = out.logits[:, -1].argmax(-1, keepdim=True)
            self._sync()
            return Generation(first, time.perf_counter() - start)

    def device_memory(self) -> DeviceMemory | None:
        if self.settings.device != "cuda":
            return None
        import torch

        return DeviceMemory(
            allocated_bytes=int(torch.cuda.memory_allocated()),
            peak_allocated_bytes=int(torch.cuda.max_memory_allocated()),
            peak_reserved_bytes=int(torch.cuda.max_memory_reserved()),
        )

    def close(self) -> None:
        import gc

        del self.model
        gc.collect()

    @classmethod
    def lm_eval_model(cls, path: Path, settings: RuntimeSettings) -> LmEvalModel:
        """lm-eval's own ``hf`` model (batched, the reference implementation users know), told
        the BOS rule explicitly (``add_bos_token``) rather than left to lm-eval's default."""
        from transformers import AutoTokenizer

        from quantkit.inputs.special_tokens import tokenizer_bos

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=settings.trust_remote_code)
        args: JsonDict = {
            "pretrained": str(path),
            "dtype": settings.compute_dtype,
            "device": settings.device,
            "trust_remote_code": settings.trust_remote_code,
            "add_bos_token": tokenizer_bos(tokenizer) is not None,
        }
        return "hf", args
