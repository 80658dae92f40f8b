"""Where quantkit keeps things: user cache, runs folder, shipped recipes and text."""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
_REPO_DIR = _PACKAGE_DIR.parent


def cache_dir() -> Path:
    """User cache (converted default model, baseline references); ``QUANTKIT_CACHE`` overrides."""
    env = os.environ.get("QUANTKIT_CACHE")
    if env:
        path = Path(env).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        path = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "quantkit"
    if path.exists() and not path.is_dir():
        from quantkit.errors import OutputError

        raise OutputError(
            f"the cache location '{path}' is a file, not a folder",
            "set QUANTKIT_CACHE (or XDG_CACHE_HOME) to a writable folder",
        )
    return path


def runs_dir() -> Path:
    """Default parent of run folders; ``QUANTKIT_RUNS_DIR`` overrides (default ``./runs``)."""
    return Path(os.environ.get("QUANTKIT_RUNS_DIR", "runs")).expanduser()


def _shipped(name: str) -> Path:
    """A data folder shipped with quantkit: inside the wheel, or beside the package in a checkout."""
    packaged = _PACKAGE_DIR / "_data" / name
    if packaged.is_dir():
        return packaged
    return _REPO_DIR / name


def recipes_dir() -> Path:
    """Folder of the ready recipes (``recipes/``)."""
    return _shipped("recipes")


def builtin_text_dir() -> Path:
    """Folder of the built-in calibration/evaluation text (``calibration/builtin``)."""
    return _shipped("calibration") / "builtin"
