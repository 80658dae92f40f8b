"""Per-position scores of one model against the baseline reference: what evaluation metrics
and their per-window forms are computed from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


@dataclass
class PositionScores:
    """Per-position arrays [N, L-1] for one model against the reference (N windows)."""

    nll: npt.NDArray[np.float64]
    kld: npt.NDArray[np.float64]
    top1_match: npt.NDArray[np.bool_]
    delta_p: npt.NDArray[np.float64]
    correct: npt.NDArray[np.bool_]  # the artifact's argmax is the actual next token

    def at(self, positions: slice) -> PositionScores:
        """Only the predicted ``positions`` of every window (see ``scored_positions``)."""
        return PositionScores(
            self.nll[:, positions],
            self.kld[:, positions],
            self.top1_match[:, positions],
            self.delta_p[:, positions],
            self.correct[:, positions],
        )
