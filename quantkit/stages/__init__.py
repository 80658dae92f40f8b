"""The stages of a run, each one file, registered by name in ``STAGES``.

A stage declares the stages whose output it uses (``depends_on``); redoing a stage drops
the recorded stages that depend on it. ``quantize``, ``bench RUN`` and ``eval RUN`` all run
stages through ``quantkit.stages.runner.StageRunner``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantkit.errors import UserInputError
from quantkit.registry import Registry

if TYPE_CHECKING:
    from quantkit.stages.base import StageClass

STAGES: Registry[StageClass] = Registry(
    "stage",
    {
        "reference": "quantkit.stages.reference:ReferenceStage",
        "quantize": "quantkit.stages.quantize:QuantizeStage",
        "evaluate": "quantkit.stages.evaluate:EvaluateStage",
        "lm_eval": "quantkit.stages.lm_eval:LmEvalStage",
        "bench": "quantkit.stages.bench:BenchStage",
        "serve_bench": "quantkit.stages.serve_bench:ServeBenchStage",
        "serve_eval": "quantkit.stages.serve_eval:ServeEvalStage",
    },
    UserInputError,
    group="quantkit.stages",
)
