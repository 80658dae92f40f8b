"""The stderr proxy that hides library progress bars."""

from __future__ import annotations

from quantkit.util.progress import _DropProgressBars


class _ReturnsNothing:
    """A stream whose write returns None, as Ray workers' redirected stderr does."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> None:
        self.text += text


def test_a_stream_whose_write_returns_none_still_counts_what_was_written() -> None:
    target = _ReturnsNothing()
    proxy = _DropProgressBars(target)
    assert proxy.write("a line\n") == len("a line\n")
    assert proxy.write("\r 50%|#####     | 5/10 [00:01<00:01, 4.00it/s]") == 46
    assert target.text == "a line\n"
