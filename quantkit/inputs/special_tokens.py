"""The BOS rule: windows start with the model's BOS exactly when its tokenizer adds one.

llama-perplexity starts every chunk with BOS when the vocabulary asks for it
(``tokenizer.ggml.add_bos_token``; it overwrites the chunk's first token), lm-eval's HF model
prepends it with ``add_bos_token``, and models such as Gemma are trained to always see it.
quantkit decides from the tokenizer itself: it adds BOS when encoding a plain text with
special tokens starts with ``bos_token_id`` (``add_bos_token`` in the tokenizer config, or a
post-processor template, as Llama and Gemma have).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantkit.errors import CalibrationError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def tokenizer_bos(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The BOS id ``tokenizer`` prepends to a text, or None when it prepends none."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return None
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return int(bos) if ids and ids[0] == bos else None


def window_bos(tokenizer: PreTrainedTokenizerBase, add_bos: bool | None, what: str) -> int | None:
    """The BOS id windows start with: the tokenizer's rule, or ``add_bos`` when set."""
    if add_bos is None:
        return tokenizer_bos(tokenizer)
    if not add_bos:
        return None
    if tokenizer.bos_token_id is None:
        raise CalibrationError(
            f"{what}.add_bos is true but the model's tokenizer has no BOS token",
            f"remove {what}.add_bos (the default follows the tokenizer)",
        )
    return int(tokenizer.bos_token_id)
