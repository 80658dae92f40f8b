"""Is a model's perplexity plausible at all? The baseline sanity guard, and the same check on
artifacts.

A model that knows its language beats every predictor that ignores context. Two such
predictors are fitted *on the very tokens scored* (so they are as strong as a context-free
predictor can be on them):

* the unigram model: each token predicted with its frequency among the scored tokens; its
  perplexity is ``exp(H)`` of that frequency distribution;
* the constant guess: always the commonest scored token; its top-1 accuracy is that token's
  share.

A plausible model has a perplexity below the first and a top-1 next-token accuracy above the
second. Measured on the built-in eval text, SmolLM2-135M: ppl 20.0 against a unigram ppl of 259
and top-1 43.2 % against 7.3 % (8 x 256 tokens); the same weights shuffled: ppl ~3e11, top-1
0.0 %; Gemma 3 with a mis-converted tokenizer: ppl 39,069. The fitted unigram is optimistic on
few tokens (on 63 tokens it reaches 40 while SmolLM2 sits at 66), so the check judges only
from ``MIN_TOKENS`` scored tokens on (the default eval set scores 12,264).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quantkit.errors import UserInputError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

MIN_TOKENS = 512

LIKELY_CAUSES = (
    "likely causes: a tokenizer that does not match the weights (e.g. from a GGUF conversion), "
    "a missing BOS token (eval.add_bos), a wrong dtype, or model code that needs --trust-remote-code"
)


class ImplausibleBaselineError(UserInputError):
    """The unquantized model does not model the eval text: its figures would mean nothing."""


def unigram_figures(targets: npt.NDArray[np.int64]) -> dict[str, float]:
    """The unigram perplexity and the constant guess's top-1 accuracy (%) on ``targets``."""
    import numpy as np

    _, counts = np.unique(np.asarray(targets).ravel(), return_counts=True)
    share = counts / counts.sum()
    entropy = float(-(share * np.log(share)).sum())
    return {"unigram_ppl": math.exp(entropy), "unigram_top1_pct": 100.0 * float(share.max())}


@dataclass(frozen=True)
class Plausibility:
    """A model's perplexity and top-1 accuracy beside the context-free bars on the same tokens."""

    ppl: float
    top1_accuracy_pct: float
    unigram_ppl: float
    unigram_top1_pct: float
    tokens: int

    @property
    def judged(self) -> bool:
        return self.tokens >= MIN_TOKENS

    def failures(self) -> list[str]:
        """What is implausible, in words (empty: plausible, or too few tokens to judge)."""
        if not self.judged:
            return []
        out = []
        if not self.ppl < self.unigram_ppl:
            out.append(f"ppl {self.ppl:.4g} is not below the unigram ppl {self.unigram_ppl:.4g}")
        if not self.top1_accuracy_pct > self.unigram_top1_pct:
            out.append(
                f"top-1 accuracy {self.top1_accuracy_pct:.1f} % is not above the "
                f"{self.unigram_top1_pct:.1f} % of always guessing the commonest token"
            )
        return out

    @property
    def plausible(self) -> bool:
        return not self.failures()

    def verdict(self) -> str:
        """``passed``, ``implausible`` or ``not judged`` (too few tokens)."""
        if not self.judged:
            return "not judged"
        return "passed" if self.plausible else "implausible"


def plausibility(
    baseline: Mapping[str, float], model: Mapping[str, float] | None = None
) -> Plausibility | None:
    """The check for the baseline (``model`` None) or for ``model``'s metrics against the bars
    kept in the baseline's; None when the figures are missing (runs made before the check)."""
    values = baseline if model is None else model
    try:
        return Plausibility(
            ppl=float(values["ppl"]),
            top1_accuracy_pct=float(values["top1_accuracy_pct"]),
            unigram_ppl=float(baseline["unigram_ppl"]),
            unigram_top1_pct=float(baseline["unigram_top1_pct"]),
            tokens=int(values["tokens"]),
        )
    except KeyError:
        return None


def artifact_check(baseline: Mapping[str, float], quantized: Mapping[str, float]) -> Plausibility | None:
    """The artifact's check, judged only where the baseline itself passed (None otherwise: an
    implausible baseline that was let through, too few tokens, or a run made before the check)."""
    base = plausibility(baseline)
    if base is None or not base.judged or not base.plausible:
        return None
    check = plausibility(baseline, quantized)
    return check if check is not None and check.judged else None


def check_baseline(check: Plausibility, allow: bool) -> None:
    """Refuse an implausible baseline unless ``allow``."""
    failures = check.failures()
    if failures and not allow:
        raise ImplausibleBaselineError(
            f"the baseline is implausible on the eval text ({check.tokens} tokens): " + "; ".join(failures),
            f"{LIKELY_CAUSES}; --allow-implausible-baseline goes on anyway",
        )
