"""Where a sweep's runs execute: one registry entry per executor (a new one is one file and
one line here)."""

from __future__ import annotations

from quantkit.errors import UserInputError
from quantkit.registry import Registry
from quantkit.sweep.executors.base import Executor

EXECUTORS: Registry[type[Executor]] = Registry(
    "executor",
    {
        "local": "quantkit.sweep.executors.local:LocalExecutor",
        "ray": "quantkit.sweep.executors.ray:RayExecutor",
    },
    UserInputError,
    group="quantkit.executors",
)
