"""The baseline's compact reference: top-k log-probs and residual mass per position, cached."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quantkit.paths import cache_dir

if TYPE_CHECKING:
    import numpy as np

    from quantkit.runtimes.base import Runtime
    from quantkit.tokens import TokenWindows

REFERENCE_VERSION = 1


@dataclass
class Reference:
    """Per window and predicted position (``L - 1`` of them): the baseline's view."""

    topk_logprobs: np.ndarray  # float32 [N, L-1, k], sorted descending
    topk_ids: np.ndarray  # int32 [N, L-1, k]
    rest_logmass: np.ndarray  # float32 [N, L-1]: log(1 - sum of top-k probs)
    target_logprobs: np.ndarray  # float32 [N, L-1]: log p(actual next token)
    key: str

    @property
    def top_k(self) -> int:
        return int(self.topk_ids.shape[-1])


def reference_key(model_fingerprint: str, windows: TokenWindows, top_k: int, device: str) -> str:
    """Cache key: model, exact token ids, k, compute device and the reference format."""
    parts = [model_fingerprint, windows.hash, str(top_k), device, str(REFERENCE_VERSION)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def cache_path(key: str) -> Path:
    return cache_dir() / "references" / f"{key}.npz"


def load_cached(key: str) -> Reference | None:
    """The cached reference for ``key``, or None when absent or unreadable."""
    import numpy as np

    path = cache_path(key)
    if not path.is_file():
        return None
    try:
        with np.load(path) as data:
            return Reference(
                topk_logprobs=data["topk_logprobs"],
                topk_ids=data["topk_ids"],
                rest_logmass=data["rest_logmass"],
                target_logprobs=data["target_logprobs"],
                key=key,
            )
    except (OSError, ValueError, KeyError):
        return None


def save(reference: Reference) -> Path:
    """Write the reference atomically into the cache."""
    import numpy as np

    path = cache_path(reference.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(
                handle,
                topk_logprobs=reference.topk_logprobs,
                topk_ids=reference.topk_ids,
                rest_logmass=reference.rest_logmass,
                target_logprobs=reference.target_logprobs,
            )
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def compute(
    runtime: Runtime,
    windows: TokenWindows,
    top_k: int,
    batch_size: int,
    key: str,
    on_batch: Callable[[int], None] = lambda n: None,
) -> Reference:
    """Score ``windows`` in the baseline ``runtime`` and keep the compact top-k reference."""
    import numpy as np

    from quantkit.runtimes.base import ScoreRequest

    ids = np.asarray(windows.ids, dtype=np.int64)
    topk_lp, topk_ids, rest, target = [], [], [], []
    for start in range(0, len(ids), batch_size):
        batch = ids[start : start + batch_size]
        scores = runtime.score(ScoreRequest(ids=batch, top_k=top_k))
        topk_lp.append(scores.topk_logprobs)
        topk_ids.append(scores.topk_ids.astype(np.int32))
        rest.append(scores.residual_logmass())
        target.append(scores.target_logprobs)
        on_batch(len(batch))
    return Reference(
        topk_logprobs=np.concatenate(topk_lp).astype(np.float32),
        topk_ids=np.concatenate(topk_ids),
        rest_logmass=np.concatenate(rest).astype(np.float32),
        target_logprobs=np.concatenate(target).astype(np.float32),
        key=key,
    )
