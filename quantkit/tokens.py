"""Token windows: the exact ids every model is calibrated or scored on, with their hash."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from quantkit.jsontypes import JsonDict


@dataclass
class TokenWindows:
    """``ids[i]`` is one window of ``seq_len`` token ids; ``hash`` identifies them exactly."""

    ids: np.ndarray
    seq_len: int
    hash: str
    source: JsonDict = field(default_factory=dict)

    def describe(self) -> JsonDict:
        return {
            "hash": self.hash,
            "windows": int(self.ids.shape[0]),
            "seq_len": self.seq_len,
            "tokens": int(self.ids.size),
            **self.source,
        }


def hash_ids(ids: np.ndarray) -> str:
    """sha256 of the int32 token ids and their shape."""
    import numpy as np

    array = np.ascontiguousarray(ids, dtype=np.int32)
    digest = hashlib.sha256(str(array.shape).encode())
    digest.update(array.tobytes())
    return digest.hexdigest()
