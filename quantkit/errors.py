"""Typed errors. Library code raises these; only the CLI prints them and picks exit codes."""

from __future__ import annotations


class QuantkitError(Exception):
    """Base error: a one-line message plus a hint on what to do about it."""

    exit_code = 3
    # a verdict on the inputs that running again cannot change: a run it stops keeps no stages
    # to resume (a kept partial run would only stand in the way of the command the hint names)
    final = False

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UserInputError(QuantkitError):
    """Something the user gave us is wrong (exit code 2)."""

    exit_code = 2


class RecipeError(UserInputError):
    """A recipe file or override is malformed or invalid."""


class ModelSourceError(UserInputError):
    """A model path or id cannot be used."""


class CalibrationError(UserInputError):
    """Calibration or evaluation text cannot be used."""


class OutputError(UserInputError):
    """An output location cannot be written (exists, not writable, ...)."""


class ArtifactError(UserInputError):
    """A model or artifact file is truncated or damaged."""


class RunNotFoundError(UserInputError):
    """A run folder given to report/gate is missing or incomplete."""


class BackendError(QuantkitError):
    """A quantization library failed while doing its job (exit code 3)."""


class MissingDependencyError(UserInputError):
    """An optional library a backend needs is not installed."""
