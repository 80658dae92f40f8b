"""quantkit wraps two llm-compressor methods for per-module losses (it has no public hook for
them; per-layer progress comes from forward pre-hooks): on another release, or where a method
is gone, the run is refused loudly instead of patched wrongly."""

from __future__ import annotations

from importlib import metadata

import pytest

from quantkit.backends import llmcompressor_run
from quantkit.errors import BackendError


class Owner:
    def method(self) -> str:
        return "original"


def test_the_pinned_release_is_patched_and_restored() -> None:
    assert metadata.version("llmcompressor").startswith(llmcompressor_run.PATCHED_FOR + ".")
    with llmcompressor_run._patched(Owner, "method", lambda self: "wrapped"):
        assert Owner().method() == "wrapped"
    assert Owner().method() == "original"


def test_another_release_or_a_missing_method_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with (
        pytest.raises(BackendError, match=r"Owner\.gone") as err,
        llmcompressor_run._patched(Owner, "gone", lambda self: None),
    ):
        pass
    assert "llmcompressor==0.14.0.1" in err.value.hint
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "0.15.0" if name == "llmcompressor" else real(name))
    with (
        pytest.raises(BackendError, match=r"llm-compressor 0\.15\.0 is not the 0\.14\.x"),
        llmcompressor_run._patched(Owner, "method", lambda self: None),
    ):
        pass
    assert Owner().method() == "original"  # nothing was changed
