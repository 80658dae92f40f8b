"""The ``evals:`` section of a recipe: extra evaluations (lm-eval tasks)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class LmEvalSpec(BaseModel):
    """lm-evaluation-harness tasks run on the baseline and the artifact."""

    model_config = ConfigDict(extra="forbid")

    tasks: list[str] = Field(min_length=1, description="lm-eval task names, e.g. quantkit_cloze, arc_easy")
    num_fewshot: int | None = Field(None, ge=0)
    limit: int | float | None = Field(None, gt=0, description="documents per task (int) or fraction (float)")
    batch_size: int = Field(8, ge=1)


class EvalEntry(BaseModel):
    """One entry of ``evals:``."""

    model_config = ConfigDict(extra="forbid")

    lm_eval: LmEvalSpec
