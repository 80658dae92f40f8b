"""The deployment-path score: the eval text as the file's own tokenizer cuts it, in bits per byte.

quantkit scores every artifact on the baseline tokenizer's ids. A GGUF's users feed it text, which
its own vocabulary cuts (llama-perplexity, llama-server, Ollama): when that vocabulary differs
from the model's, the file is worse than its scores say. Each eval window's text (the bytes its
tokens spell) is cut again by the file's own tokenizer, led by BOS as the file says, and scored in
the same runtime. Both paths are put in bits per byte of the text their predicted tokens spell,
which does not depend on how the text was cut:

    bpb = sum over predicted tokens of -log2 q(token) / bytes those tokens spell

A window the file cuts into exactly quantkit's ids is not scored twice: the same ids through the
same runtime give the same log-probs. The gap ``100 * (own / ids - 1)`` is flagged when it is
beyond the run's noise: two standard errors of the per-window gaps (each window's text scored
both ways, so the text's own variation cancels), and at least ``GAP_FLOOR_PCT`` (a window cut
anew can differ at its first token from the same text cut in one stream).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from quantkit.inputs.tokens import TokenWindows
    from quantkit.runtimes.base import OwnTokenizer, Runtime

GAP_FLOOR_PCT = 1.0
_LN2 = math.log(2.0)


@dataclass(frozen=True)
class OwnWindows:
    """The eval windows as the file's own tokenizer cuts their text."""

    ids: list[list[int]]  # per window: BOS (when the file adds it) + the file's ids of the text
    same: list[bool]  # the file's ids equal quantkit's window
    own_bytes: list[int]  # bytes spelled by the predicted tokens (all but the first), own cut
    ids_bytes: list[int]  # the same for quantkit's window
    ids_tokens: int  # tokens quantkit's windows predict


class DeploymentScore(BaseModel):
    """Bits per byte of the eval windows' text through quantkit's ids and the file's own cut."""

    model_config = ConfigDict(extra="forbid")

    baseline_bpb: float  # the baseline on quantkit's ids
    ids_bpb: float  # the artifact on quantkit's ids
    own_bpb: float  # the artifact on its own tokenizer's ids
    gap_pct: float  # 100 * (own_bpb / ids_bpb - 1)
    noise_pct: float  # the flag's threshold: max(GAP_FLOOR_PCT, 2 standard errors of the window gaps)
    flagged: bool  # |gap_pct| > noise_pct
    windows: int
    windows_cut_differently: int
    ids_tokens: int
    own_tokens: int
    bytes: int

    def metrics(self) -> dict[str, float]:
        """The quantized side's metrics (``bpb`` is quantkit's ids, as every other metric)."""
        return {
            "bpb": self.ids_bpb,
            "deployed_bpb": self.own_bpb,
            "deployed_bpb_gap_pct": self.gap_pct,
            "deployed_bpb_noise_pct": self.noise_pct,
        }


def own_windows(own: OwnTokenizer, windows: TokenWindows) -> OwnWindows:
    """Each window's text cut by ``own`` (BOS-led when the file adds BOS)."""
    bos = own.bos_token_id if own.adds_bos else None
    led = windows.source.get("bos") is not None  # quantkit's windows: BOS replaced the first token
    ids, same, own_bytes, ids_bytes = [], [], [], []
    for row in windows.ids.tolist():
        text_ids = row[1:] if led else row
        cut = ([] if bos is None else [bos]) + own.tokenize(own.text(text_ids), special=False)
        ids.append(cut)
        same.append(cut == row)
        own_bytes.append(len(own.detokenize(cut[1:])))
        ids_bytes.append(len(own.detokenize(row[1:])))
    predicted = int(windows.ids.shape[0] * (windows.ids.shape[1] - 1))
    return OwnWindows(ids=ids, same=same, own_bytes=own_bytes, ids_bytes=ids_bytes, ids_tokens=predicted)


def window_nll(runtime: Runtime, ids: list[int]) -> float:
    """Total negative log-likelihood (nats) of the predicted tokens of one window."""
    import numpy as np

    from quantkit.runtimes.base import ScoreRequest

    scores = runtime.score(ScoreRequest(ids=np.asarray([ids], dtype=np.int64), top_k=1))
    return float(-scores.target_logprobs.astype(np.float64).sum())


def deployment_score(
    cut: OwnWindows,
    ids_nll: npt.NDArray[np.float64],
    baseline_nll: npt.NDArray[np.float64],
    own_nll: dict[int, float],
) -> DeploymentScore:
    """The score from per-window total NLLs: ``ids_nll``/``baseline_nll`` [N] on quantkit's ids,
    ``own_nll`` for the windows the file cuts differently (by index)."""
    import numpy as np

    own = np.array([own_nll.get(i, float(ids_nll[i])) for i in range(len(cut.ids))], dtype=np.float64)
    own_bytes = np.array(cut.own_bytes, dtype=np.float64)
    ids_bytes = np.array(cut.ids_bytes, dtype=np.float64)
    ids_bpb = float(ids_nll.sum() / ids_bytes.sum() / _LN2)
    own_bpb = float(own.sum() / own_bytes.sum() / _LN2)
    gaps = 100.0 * ((own / own_bytes) / (ids_nll / ids_bytes) - 1.0)  # per window, paired
    se = float(gaps.std(ddof=1) / math.sqrt(len(gaps))) if len(gaps) > 1 else 0.0
    gap = 100.0 * (own_bpb / ids_bpb - 1.0)
    noise = max(GAP_FLOOR_PCT, 2.0 * se)
    return DeploymentScore(
        baseline_bpb=float(baseline_nll.sum() / ids_bytes.sum() / _LN2),
        ids_bpb=ids_bpb,
        own_bpb=own_bpb,
        gap_pct=gap,
        noise_pct=noise,
        flagged=abs(gap) > noise,
        windows=len(cut.ids),
        windows_cut_differently=sum(not same for same in cut.same),
        ids_tokens=cut.ids_tokens,
        own_tokens=sum(len(row) - 1 for row in cut.ids),
        bytes=int(ids_bytes.sum()),
    )
