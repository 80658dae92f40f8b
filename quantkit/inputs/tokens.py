"""Token windows: the exact ids every model is calibrated or scored on, with their hash."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from quantkit.jsontypes import JsonDict


@dataclass
class TokenWindows:
    """``ids[i]`` is one window of ``seq_len`` token ids; ``hash`` identifies them exactly."""

    ids: npt.NDArray[np.int64]  # [windows, seq_len]
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


WINDOW_RULES = 2  # 2: the BOS rule (windows led by BOS when the tokenizer adds one)


def hash_ids(ids: npt.NDArray[np.int32] | npt.NDArray[np.int64], bos: int | None = None) -> str:
    """sha256 of the int32 token ids, their shape and the window rule (version and BOS), so
    caches keyed on windows made under an older rule are never reused."""
    import numpy as np

    array = np.ascontiguousarray(ids, dtype=np.int32)
    digest = hashlib.sha256(f"rules={WINDOW_RULES};bos={bos};".encode() + str(array.shape).encode())
    digest.update(array.tobytes())
    return digest.hexdigest()
