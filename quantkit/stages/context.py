"""The bundle every stage receives: recipe, model, device, backend, run folder, journal,
progress reporter, token windows, settings and the results of the stages run so far."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pydantic import JsonValue

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from quantkit.backends.base import Backend, BackendOptions
    from quantkit.device import BaselineDtype
    from quantkit.inputs.models import ModelSource
    from quantkit.inputs.recipe import Recipe
    from quantkit.inputs.tokens import TokenWindows
    from quantkit.run.journal import Journal
    from quantkit.stages.results import RunResults
    from quantkit.util.progress import Reporter


class RunFolder(Protocol):
    """Where a run's files go: the hidden folder of a run being built, or a finished run."""

    @property
    def folder(self) -> Path: ...

    @property
    def artifact_dir(self) -> Path: ...

    def write_text(self, name: str, text: str) -> Path: ...

    def write_json(self, name: str, data: JsonValue) -> Path: ...


@dataclass(frozen=True)
class RunSettings:
    """What the user asked for beyond the recipe."""

    verbose: bool = False
    trust_remote_code: bool = False
    allow_implausible_baseline: bool = False  # go on past the baseline sanity guard
    shared_baseline: Path | None = None  # a sweep's folder of baseline measurements every run reuses


class Tokens:
    """The eval and calibration windows of a run, tokenized with the source model's tokenizer
    on first use (a bench of a finished run never needs them)."""

    def __init__(
        self, recipe: Recipe, source: ModelSource, needs_calibration: bool, trust_remote_code: bool
    ) -> None:
        self.recipe = recipe
        self.source = source
        self.needs_calibration = needs_calibration and recipe.calibration is not None
        self.trust_remote_code = trust_remote_code
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._eval: TokenWindows | None = None
        self._calibration: TokenWindows | None = None

    def tokenizer(self) -> PreTrainedTokenizerBase:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(
                self.source.path, trust_remote_code=self.trust_remote_code
            )
        return self._tokenizer

    def eval_windows(self) -> TokenWindows:
        if self._eval is None:
            from quantkit.inputs.calibration import eval_windows

            self._eval = eval_windows(self.recipe.eval, self.tokenizer())
        return self._eval

    def texts(self) -> dict[str, str]:
        """The texts this run's eval and calibration windows come from, by role."""
        from quantkit.inputs.calibration import window_text

        texts = {"eval": window_text(self.recipe.eval, self.tokenizer(), "eval")}
        spec = self.recipe.calibration
        if self.needs_calibration and spec is not None:
            texts["calibration"] = window_text(spec, self.tokenizer(), "calibration", spec.chat_template)
        return texts

    def own_texts(self) -> dict[str, str]:
        """The texts this run's windows come from, by role, where they are not the built-in
        ones as they are (which a GGUF source's tokenizer was checked on when converted)."""
        from quantkit.inputs.calibration import window_text

        texts: dict[str, str] = {}
        if self.recipe.eval.source != "builtin":
            texts["eval"] = window_text(self.recipe.eval, self.tokenizer(), "eval")
        spec = self.recipe.calibration
        if self.needs_calibration and spec is not None and (spec.source != "builtin" or spec.chat_template):
            texts["calibration"] = window_text(spec, self.tokenizer(), "calibration", spec.chat_template)
        return texts

    def calibration_windows(self) -> TokenWindows | None:
        """Calibration tokens, or None when the backend's options need none."""
        if not self.needs_calibration or self.recipe.calibration is None:
            return None
        if self._calibration is None:
            from quantkit.inputs.calibration import calibration_windows

            self._calibration = calibration_windows(self.recipe.calibration, self.tokenizer())
        return self._calibration


@dataclass
class RunContext:
    """Everything a stage needs, passed as one object."""

    recipe: Recipe
    source: ModelSource
    device: str
    backend: Backend[BackendOptions]
    run: RunFolder
    journal: Journal
    reporter: Reporter
    tokens: Tokens
    results: RunResults
    settings: RunSettings = field(default_factory=RunSettings)

    @property
    def dtype(self) -> BaselineDtype:
        """The baseline's precision on this run's device (the recipe's ``baseline.dtype``)."""
        from quantkit.device import baseline_dtype

        return baseline_dtype(self.device, self.recipe.baseline.dtype)
