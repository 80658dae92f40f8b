"""quantkit's GGUF header reader against gguf-py's GGUFReader, and on broken files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import require_extra

from quantkit.llamacpp.gguf_file import GGUFFormatError, read_gguf

require_extra("gguf", "gguf")


@pytest.fixture(scope="module")
def shipped() -> Path:
    from quantkit.inputs.models import _embedded_gguf

    return _embedded_gguf("smollm2-135m")


def test_the_header_reads_as_gguf_py_reads_it(shipped: Path) -> None:
    """Every key/value (the 49k-token vocabulary and its merges included) and every tensor's
    name, shape, type, offset and size, on the Q4_1 file the embedded model's package ships."""
    import gguf

    theirs = gguf.GGUFReader(str(shipped))
    ours = read_gguf(shipped)
    assert ours.version == 3 and ours.data_offset == theirs.data_offset
    assert ours.fields == {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert len(ours.fields["tokenizer.ggml.tokens"]) == 49152
    expected = [
        (t.name, tuple(int(d) for d in t.shape), t.tensor_type.name, int(t.data_offset), int(t.n_bytes))
        for t in theirs.tensors
    ]
    assert [(t.name, t.shape, t.type_name, t.data_offset, t.n_bytes) for t in ours.tensors] == expected
    assert ours.data_end == shipped.stat().st_size


@pytest.mark.parametrize("keep", [3, 30, 100_000, 1_785_000])
def test_a_cut_header_is_a_format_error(shipped: Path, tmp_path: Path, keep: int) -> None:
    """Cut in the magic, in the counts, in the vocabulary, in the tensor infos."""
    cut = tmp_path / "cut.gguf"
    with shipped.open("rb") as handle:
        cut.write_bytes(handle.read(keep))
    with pytest.raises(GGUFFormatError):
        read_gguf(cut)


def test_a_cut_in_the_tensor_data_shows_in_data_end(shipped: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    with shipped.open("rb") as handle:
        cut.write_bytes(handle.read(5_000_000))
    assert read_gguf(cut).data_end == shipped.stat().st_size > 5_000_000


def test_a_rewritten_file_is_read_again(shipped: Path, tmp_path: Path) -> None:
    copy = tmp_path / "m.gguf"
    copy.write_bytes(shipped.read_bytes())
    assert read_gguf(copy).data_end == copy.stat().st_size
    with shipped.open("rb") as handle:
        copy.write_bytes(handle.read(5_000_000))
    os.utime(copy, ns=(1, 1))  # a new size and mtime: the cached header is not reused
    assert read_gguf(copy).data_end > copy.stat().st_size
