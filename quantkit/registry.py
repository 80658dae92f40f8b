"""A lazy registry: name -> "module:Class", imported only when it is used.

There is one registry per kind, beside the kind: ``quantkit.backends.BACKENDS``,
``quantkit.backends.gptq.GPTQ_ENGINES``, ``quantkit.runtimes.RUNTIMES``,
``quantkit.stages.STAGES``, ``quantkit.sweep.executors.EXECUTORS`` and
``quantkit.serving.server.SERVERS``. Adding one to quantkit is one file plus one line in its
table; a third-party package adds one without editing quantkit, through the registry's
entry-point group (``quantkit.backends``, ``quantkit.runtimes``, ``quantkit.stages``,
``quantkit.executors``, ``quantkit.servers``) in its distribution's metadata, which every
process sees (the bench subprocess, Ray workers). Listing names imports nothing heavy; an
unknown name is an error with a did-you-mean hint.
"""

from __future__ import annotations

import difflib
import importlib
from importlib import metadata
from typing import Generic, TypeVar

from quantkit.errors import UserInputError

T = TypeVar("T")


def did_you_mean(name: str, choices: list[str]) -> str:
    """A 'did you mean X?' hint, or a list of valid choices when nothing is close."""
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    if close:
        return f"did you mean '{close[0]}'?"
    return "choose one of: " + ", ".join(choices)


class Registry(Generic[T]):
    """Named entries of one kind, each a ``"module:attribute"`` string until first used: the
    built-in ``entries``, those ``register``ed at run time, then those installed packages
    declare in the entry-point ``group`` (a built-in name cannot be taken over)."""

    def __init__(
        self, kind: str, entries: dict[str, str], error: type[UserInputError], group: str | None = None
    ) -> None:
        self.kind = kind
        self.group = group
        self._entries = dict(entries)
        self._error = error
        self._plugins: dict[str, metadata.EntryPoint] | None = None

    def plugins(self) -> dict[str, metadata.EntryPoint]:
        """The entries installed packages declare in this registry's group (read once)."""
        if self._plugins is None:
            found = metadata.entry_points(group=self.group) if self.group else ()
            self._plugins = {point.name: point for point in found if point.name not in self._entries}
        return self._plugins

    def names(self) -> list[str]:
        return sorted({*self._entries, *self.plugins()})

    def ordered_names(self) -> list[str]:
        """The built-in and registered entries in their table's order, then plug-ins' by name."""
        return [*self._entries, *sorted(self.plugins())]

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self.plugins()

    def register(self, name: str, target: str) -> None:
        """Add (or replace) an entry: ``target`` is ``"package.module:Attribute"``."""
        self._entries[name] = target

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)

    def get(self, name: str) -> T:
        target = self._entries.get(name)
        if target is not None:
            module_name, _, attribute = target.partition(":")
            loaded: T = getattr(importlib.import_module(module_name), attribute)
            return loaded
        point = self.plugins().get(name)
        if point is None:
            raise self._error(f"unknown {self.kind} '{name}'", did_you_mean(name, self.names()))
        plugin: T = load_plugin(point, self.kind, self._error)  # type: ignore[assignment]
        return plugin


def load_plugin(point: metadata.EntryPoint, kind: str, error: type[UserInputError]) -> object:
    """What an installed package's entry point names; one that cannot be imported is an
    ``error`` naming its package."""
    try:
        return point.load()
    except (ImportError, AttributeError) as err:
        package = point.dist.name if point.dist is not None else "its package"
        raise error(
            f"the {kind} '{point.name}' from {package} ({point.value}) cannot be loaded: {err}",
            f"reinstall {package}, or uninstall it",
        ) from None
