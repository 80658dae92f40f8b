"""Load-test prompts from real text: slices of the eval token stream at each requested length,
at seeded offsets, decoded to text (every server takes text; token-id prompts are vLLM's)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantkit.errors import UserInputError
from quantkit.serving.loadgen import Prompt

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from transformers import PreTrainedTokenizerBase

POOL = 16  # distinct prompts per length


def prompt_pools(
    tokenizer: PreTrainedTokenizerBase,
    ids: npt.NDArray[np.int64],
    lengths: list[int],
    seed: int,
    bos: int | None,
) -> dict[int, list[Prompt]]:
    """``POOL`` prompts per length from the token stream ``ids`` (windows flattened, BOS dropped)."""
    import numpy as np

    stream = np.asarray(ids, dtype=np.int64).reshape(-1)
    if bos is not None:
        stream = stream[stream != bos]
    rng = np.random.default_rng(seed)
    pools: dict[int, list[Prompt]] = {}
    for length in sorted(set(lengths)):
        if length >= len(stream):
            raise UserInputError(
                f"a prompt of {length} tokens is longer than the eval text ({len(stream)} tokens)",
                "give shorter --prompt-lengths, or more eval text (eval.num_windows / eval.seq_len)",
            )
        starts = rng.integers(0, len(stream) - length, size=POOL)
        pools[length] = [
            Prompt(text=str(tokenizer.decode(stream[s : s + length].tolist())), tokens=length) for s in starts
        ]
    return pools


def default_pools(tokenizer_spec: str, lengths: list[int], seed: int) -> tuple[dict[int, list[Prompt]], str]:
    """Prompts for an endpoint measured without a run: the built-in eval text, cut with the
    tokenizer of ``tokenizer_spec`` (a model path or id; the embedded default by default)."""
    from transformers import AutoTokenizer

    from quantkit.inputs.calibration import eval_windows
    from quantkit.inputs.models import resolve_model
    from quantkit.inputs.specs import EvalSpec

    source = resolve_model(tokenizer_spec)
    tokenizer = AutoTokenizer.from_pretrained(source.path)
    windows = eval_windows(EvalSpec(), tokenizer)
    pools = prompt_pools(tokenizer, windows.ids, lengths, seed, tokenizer.bos_token_id)
    return pools, f"the built-in eval text, lengths in {tokenizer_spec}'s tokens"
