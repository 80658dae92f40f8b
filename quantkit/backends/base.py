"""The Backend interface: typed options, a calibration capability flag, and quantize().

A backend is generic over its options model: ``GPTQBackend(Backend[GPTQOptions])`` gets its
own options type back from ``self.options``, validated once by ``Backend.from_raw``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar, cast

from pydantic import BaseModel, ConfigDict, JsonValue

from quantkit.inputs.specs import RunKind

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from quantkit.inputs.tokens import TokenWindows


class BackendOptions(BaseModel):
    """Options of one backend; unknown fields are recipe errors naming the field."""

    model_config = ConfigDict(extra="forbid")


OptionsT_co = TypeVar("OptionsT_co", bound=BackendOptions, covariant=True)


def _silent(message: str) -> None:
    return None


def _no_progress(index: int) -> None:
    return None


@dataclass
class QuantizeJob:
    """Everything a backend needs to make one artifact (its options live on the backend)."""

    model_path: Path
    out_dir: Path
    device: str
    seed: int
    calibration: TokenWindows | None = None
    trust_remote_code: bool = False
    verbose: bool = False
    log: Callable[[str], None] = _silent
    on_layer: Callable[[int], None] = _no_progress  # a decoder layer index is being worked on


@dataclass
class Artifact:
    """A quantized model on disk and how to run it."""

    path: Path
    format: str
    runtime: str
    scheme: str
    weight_bits: float
    details: dict[str, JsonValue] = field(default_factory=dict)


class Backend(ABC, Generic[OptionsT_co]):
    """A quantization method with its validated options. Registered in ``quantkit.backends.BACKENDS``."""

    name: ClassVar[str]
    summary: ClassVar[str]
    options_model: ClassVar[type[BackendOptions]]
    runtime: ClassVar[str] = "hf"
    library: ClassVar[str] = ""
    run_kind: ClassVar[RunKind] = "quantized"  # "external": the artifact was imported, not made

    def __init__(self, options: OptionsT_co) -> None:
        self._options = options

    @property
    def options(self) -> OptionsT_co:
        return self._options

    @classmethod
    def from_raw(cls, raw: Mapping[str, JsonValue]) -> Backend[BackendOptions]:
        """Validate raw recipe options into this backend (pydantic errors propagate)."""
        options = cast("OptionsT_co", cls.options_model.model_validate(dict(raw)))
        return cls(options)

    def check_options(self) -> None:
        """Refuse option combinations that cannot work (before any model is loaded)."""
        return None

    def check_dependencies(self) -> None:
        """Refuse to start when a library these options need is missing (a
        MissingDependencyError naming the extra), before the model is resolved or loaded; not
        part of recipe validation, so a recipe validates where its engine is not installed."""
        return None

    @abstractmethod
    def requires_calibration(self) -> bool:
        """Whether these options need calibration tokens (the pipeline decides, not the user)."""

    def check_model(self, config: Mapping[str, JsonValue]) -> None:
        """Refuse options that cannot fit this model (from its config.json, before loading it)."""
        return None

    def check_weights(self, model_path: Path) -> None:
        """Refuse options that name or misfit this model's tensors (from the safetensors headers
        of the HF folder, before loading it)."""
        return None

    @abstractmethod
    def describe(self) -> tuple[str, float]:
        """The scheme name and nominal bits per quantized weight these options give."""

    @abstractmethod
    def quantize(self, job: QuantizeJob) -> Artifact:
        """Quantize ``job.model_path`` into ``job.out_dir`` and describe the artifact."""

    def inputs(self) -> list[Path]:
        """Files the backend reads besides the model (never written to; their size counts)."""
        return []

    def input_fingerprint(self) -> dict[str, JsonValue]:
        """What a resumed run must share about ``inputs()`` (beyond the recipe)."""
        return {}

    def check_vocabulary(self, tokenizer: PreTrainedTokenizerBase, token_ids: Sequence[int]) -> None:
        """Refuse an input whose token ids mean something else than the baseline's."""
        return None

    def runtime_baseline(self, model_path: Path, log: Callable[[str], None]) -> Path | None:
        """The unquantized model in this backend's runtime when that is not transformers (the
        F16 GGUF for llama.cpp), so speed is also compared runtime against runtime."""
        return None

    def speed_caveat(self, device: str) -> str | None:
        """Why the artifact's speed on ``device`` says little about its format, when its runtime
        emulates the format there (FP8 decompressed on the CPU); shown beside the speed ratios."""
        return None
