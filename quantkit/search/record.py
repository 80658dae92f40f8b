"""``search.json``: what a search was asked, its paths, every candidate and the winner (read
by the search and by its report)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from quantkit.search.profile import SEARCH_FORMATS, SearchFormat

BudgetMetric = Literal["kld_mean", "ppl_increase_pct"]
Objective = Literal["size", "decode", "memory"]
FORMATS = SEARCH_FORMATS
OBJECTIVES: tuple[Objective, ...] = ("size", "decode", "memory")
# what each objective ranks the candidates that met the budget by, as the report words it
OBJECTIVE_TERMS = {
    "size": "the fewest bits per weight",
    "decode": "the fastest measured decode (tokens/s, llama.cpp)",
    "memory": "the least measured peak memory (llama.cpp)",
}


class Budget(BaseModel):
    """The quality a candidate must keep: a metric of the run and its ceiling."""

    metric: BudgetMetric
    limit: float = Field(ge=0)

    def describe(self) -> str:
        return f"KLD <= {self.limit:g}" if self.metric == "kld_mean" else f"ppl increase <= {self.limit:g}%"


class Candidate(BaseModel):
    """One evaluated point of the path."""

    name: str
    format: SearchFormat = "gguf"
    index: int
    predicted_bpw: float
    predicted_kld_increase: float
    run_id: str
    recipe: str
    value: float | None = None
    kld: float | None = None
    bpw: float | None = None
    decode_tok_s: float | None = None
    peak_memory_bytes: float | None = None
    passed: bool | None = None
    error: str | None = None


class FormatPath(BaseModel):
    """One format's demotion path: where its profile came from, its steps and end sizes."""

    format: SearchFormat
    profile: str
    steps: int
    bpw: list[float] = Field(description="predicted bits per parameter at the path's start and end")
    group_size: int | None = None


class SearchRecord(BaseModel):
    """``search.json``: the request, the paths, every candidate and the winner."""

    model: str
    budget: Budget
    objective: Objective
    seed: int
    max_candidates: int
    formats: list[SearchFormat]
    paths: list[FormatPath]
    candidates: list[Candidate] = Field(default_factory=list)
    chosen: str | None = None
    why: str = ""
    frontier_found: bool = False
    seconds: dict[str, float] = Field(default_factory=dict)
