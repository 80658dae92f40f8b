"""JSON value types for data that crosses into files (manifests, journals, reports)."""

from __future__ import annotations

from typing import TypeAlias

from pydantic import JsonValue

JsonDict: TypeAlias = dict[str, JsonValue]

__all__ = ["JsonDict", "JsonValue"]
