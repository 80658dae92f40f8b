"""A lazy registry: name -> "module:Class", imported only when it is used.

There is one registry per kind, beside the kind: ``quantkit.backends.BACKENDS``,
``quantkit.runtimes.RUNTIMES`` and ``quantkit.stages.STAGES``. Adding a backend, runtime or
stage is one file plus one line in its table. Listing names imports nothing heavy; an
unknown name is an error with a did-you-mean hint.
"""

from __future__ import annotations

import difflib
import importlib
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
    """Named entries of one kind, each a ``"module:attribute"`` string until first used."""

    def __init__(self, kind: str, entries: dict[str, str], error: type[UserInputError]) -> None:
        self.kind = kind
        self._entries = dict(entries)
        self._error = error

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def register(self, name: str, target: str) -> None:
        """Add (or replace) an entry: ``target`` is ``"package.module:Attribute"``."""
        self._entries[name] = target

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)

    def get(self, name: str) -> T:
        target = self._entries.get(name)
        if target is None:
            raise self._error(f"unknown {self.kind} '{name}'", did_you_mean(name, self.names()))
        module_name, _, attribute = target.partition(":")
        loaded: T = getattr(importlib.import_module(module_name), attribute)
        return loaded
