"""The baseline's compact reference, cached: per position its top-k log-probs, the residual
mass, and a sample of ids drawn from the rest of its distribution (for the KLD's tail)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quantkit.errors import BackendError
from quantkit.paths import cache_dir
from quantkit.util.fileio import share_modes

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from quantkit.device import BaselineDtype
    from quantkit.inputs.tokens import TokenWindows
    from quantkit.runtimes.base import Runtime

REFERENCE_VERSION = 2  # 2: tail samples


@dataclass
class Reference:
    """Per window and predicted position (``L - 1`` of them): the baseline's view."""

    topk_logprobs: npt.NDArray[np.float32]  # [N, L-1, k], sorted descending
    topk_ids: npt.NDArray[np.int32]  # [N, L-1, k]
    rest_logmass: npt.NDArray[np.float32]  # [N, L-1]: log(1 - sum of top-k probs)
    target_logprobs: npt.NDArray[np.float32]  # [N, L-1]: log p(actual next token)
    key: str
    tail_ids: npt.NDArray[np.int32] | None = None  # [N, L-1, m]: drawn ∝ p outside the top-k
    tail_logprobs: npt.NDArray[np.float32] | None = None  # [N, L-1, m]: their log p

    @property
    def top_k(self) -> int:
        return int(self.topk_ids.shape[-1])

    def at(self, positions: slice) -> Reference:
        """The reference at the predicted ``positions`` of every window only."""
        return Reference(
            topk_logprobs=self.topk_logprobs[:, positions],
            topk_ids=self.topk_ids[:, positions],
            rest_logmass=self.rest_logmass[:, positions],
            target_logprobs=self.target_logprobs[:, positions],
            key=self.key,
            tail_ids=None if self.tail_ids is None else self.tail_ids[:, positions],
            tail_logprobs=None if self.tail_logprobs is None else self.tail_logprobs[:, positions],
        )

    @property
    def tail_samples(self) -> int:
        return 0 if self.tail_ids is None else int(self.tail_ids.shape[-1])


@dataclass(frozen=True)
class ReferenceShape:
    """What a reference keeps per position (``top_k`` log-probs, ``tail_samples`` drawn ids)
    and how many windows are scored at once."""

    top_k: int
    batch_size: int = 4
    tail_samples: int = 0


def reference_key(
    model_fingerprint: str,
    windows: TokenWindows,
    top_k: int,
    device: str,
    tail_samples: int = 0,
    *,
    dtype: BaselineDtype,
) -> str:
    """Cache key: model, exact token ids, k, tail samples, compute device and precision, and
    the format (a reference computed in bfloat16 is never reused for a float32 baseline)."""
    parts = [model_fingerprint, windows.hash, str(top_k), device, str(REFERENCE_VERSION)]
    parts += [f"tail={tail_samples}", f"dtype={dtype}"]
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
            tail = "tail_ids" in data.files
            return Reference(
                topk_logprobs=data["topk_logprobs"],
                topk_ids=data["topk_ids"],
                rest_logmass=data["rest_logmass"],
                target_logprobs=data["target_logprobs"],
                key=key,
                tail_ids=data["tail_ids"] if tail else None,
                tail_logprobs=data["tail_logprobs"] if tail else None,
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
            arrays = {
                "topk_logprobs": reference.topk_logprobs,
                "topk_ids": reference.topk_ids,
                "rest_logmass": reference.rest_logmass,
                "target_logprobs": reference.target_logprobs,
            }
            if reference.tail_ids is not None and reference.tail_logprobs is not None:
                arrays |= {"tail_ids": reference.tail_ids, "tail_logprobs": reference.tail_logprobs}
            np.savez(handle, allow_pickle=False, **arrays)
        share_modes(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def compute(
    runtime: Runtime,
    windows: TokenWindows,
    shape: ReferenceShape,
    key: str,
    on_batch: Callable[[int], None] = lambda n: None,
) -> Reference:
    """Score ``windows`` in the baseline ``runtime`` and keep the compact reference. The tail
    samples are seeded from ``key``, so the same reference is drawn the same way every time."""
    import numpy as np

    from quantkit.runtimes.base import ScoreRequest

    ids = np.asarray(windows.ids, dtype=np.int64)
    topk_lp, topk_ids, rest, target, tail_ids, tail_lp = [], [], [], [], [], []
    seed = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    for start in range(0, len(ids), shape.batch_size):
        batch = ids[start : start + shape.batch_size]
        request = ScoreRequest(batch, shape.top_k, tail_samples=shape.tail_samples, seed=seed + start)
        scores = runtime.score(request)
        topk_lp.append(scores.topk_logprobs)
        topk_ids.append(scores.topk_ids.astype(np.int32))
        rest.append(scores.residual_logmass())
        target.append(scores.target_logprobs)
        if shape.tail_samples:
            if scores.tail_ids is None or scores.tail_logprobs is None:
                raise BackendError(
                    f"the {runtime.name} runtime cannot sample the tail", "use tail_samples: 0"
                )
            tail_ids.append(scores.tail_ids.astype(np.int32))
            tail_lp.append(scores.tail_logprobs)
        on_batch(len(batch))
    return Reference(
        topk_logprobs=np.concatenate(topk_lp).astype(np.float32),
        topk_ids=np.concatenate(topk_ids),
        rest_logmass=np.concatenate(rest).astype(np.float32),
        target_logprobs=np.concatenate(target).astype(np.float32),
        key=key,
        tail_ids=np.concatenate(tail_ids) if tail_ids else None,
        tail_logprobs=np.concatenate(tail_lp).astype(np.float32) if tail_lp else None,
    )
