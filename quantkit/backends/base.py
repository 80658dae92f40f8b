"""The Backend interface: typed options, a calibration capability flag, and quantize()."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

from quantkit.errors import RecipeError

if TYPE_CHECKING:
    from quantkit.calibration import TokenWindows
    from quantkit.recipe import Recipe


class BackendOptions(BaseModel):
    """Options of one backend; unknown fields are recipe errors naming the field."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class QuantizeJob:
    """Everything a backend needs to make one artifact."""

    model_path: Path
    options: BackendOptions
    out_dir: Path
    device: str
    seed: int
    calibration: TokenWindows | None = None
    trust_remote_code: bool = False
    verbose: bool = False
    log: Callable[[str], None] = lambda message: None
    on_layer: Callable[[int], None] = lambda index: None  # a decoder layer index is being worked on


@dataclass
class Artifact:
    """A quantized model on disk and how to run it."""

    path: Path
    format: str
    runtime: str
    scheme: str
    weight_bits: float
    details: dict[str, Any] = field(default_factory=dict)


class Backend(ABC):
    """A quantization method. Subclasses are registered by name in ``quantkit.registry``."""

    name: ClassVar[str]
    summary: ClassVar[str]
    Options: ClassVar[type[BackendOptions]]
    runtime: ClassVar[str] = "hf"
    library: ClassVar[str] = ""

    @classmethod
    @abstractmethod
    def requires_calibration(cls, options: Any) -> bool:
        """Whether these options need calibration tokens (the pipeline decides, not the user)."""

    @classmethod
    def check_recipe(cls, options: Any, recipe: Recipe) -> None:
        """Refuse option combinations that cannot work, before any model is loaded."""
        if cls.requires_calibration(options) and recipe.calibration is None:
            raise RecipeError(
                f"method '{cls.name}' with these options needs calibration data, but calibration is null",
                "remove 'calibration: null' (the built-in set is the default) or give a source",
            )

    @classmethod
    def check_model(cls, options: Any, config: dict[str, Any]) -> None:
        """Refuse options that cannot fit this model (from its config.json, before loading it)."""
        return None

    @classmethod
    @abstractmethod
    def describe(cls, options: Any) -> tuple[str, float]:
        """The scheme name and nominal weight bits these options give."""

    @abstractmethod
    def quantize(self, job: QuantizeJob) -> Artifact:
        """Quantize ``job.model_path`` into ``job.out_dir`` and describe the artifact."""
