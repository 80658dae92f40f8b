"""The transformers runtime: loads an HF folder (plain or compressed-tensors) and scores ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def torch_dtype_for(device: str) -> Any:
    """Compute dtype: fp32 on the CPU (exact, and fast there), bf16 on CUDA."""
    import torch

    return torch.float32 if device == "cpu" else torch.bfloat16


class HFRuntime:
    """A causal LM loaded with transformers; ``log_probs`` returns next-token log-probs."""

    name = "transformers"

    def __init__(self, path: Path, device: str, trust_remote_code: bool = False, **_: Any) -> None:
        from transformers import AutoModelForCausalLM

        self.device = device
        model: Any = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch_dtype_for(device), trust_remote_code=trust_remote_code
        )
        self.model: Any = model.to(device)
        self.model.eval()

    def log_probs(self, ids: Any) -> Any:
        """Float32 log-softmax over the vocabulary for each position of ``ids`` [B, L]."""
        import torch

        with torch.inference_mode():
            logits = self.model(input_ids=ids.to(self.device)).logits
        return torch.log_softmax(logits.float(), dim=-1)

    def close(self) -> None:
        import gc

        del self.model
        gc.collect()
