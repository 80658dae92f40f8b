"""The run journal: stages verified by checksum, a fingerprint guard, and the GGUF file check."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantkit.errors import ArtifactError, OutputError
from quantkit.results.store import RunWriter, find_resumable, is_locked, partial_dir
from quantkit.run.journal import Journal

FINGERPRINT = {
    "recipe": {"name": "r", "options": {"bits": 4}},
    "model": "abc",
    "libraries": {"torch": "2.13"},
}


def test_a_completed_stage_is_trusted_only_while_its_files_verify(tmp_path: Path) -> None:
    journal = Journal.open(tmp_path, {"id": 1}, FINGERPRINT)
    weights = tmp_path / "artifact" / "w.bin"
    weights.parent.mkdir()
    weights.write_bytes(b"0123456789")
    journal.complete("quantize", {"scheme": "W4"}, [weights])
    reopened = Journal.open(tmp_path, {"id": 1}, FINGERPRINT)
    assert reopened.completed("quantize") == {"scheme": "W4"}
    assert reopened.resumed == ["quantize"] and reopened.holds_work()
    weights.write_bytes(b"0123456788")  # same size, other content
    again = Journal.open(tmp_path, {"id": 1}, FINGERPRINT)
    assert again.completed("quantize") is None
    assert "quantize" not in Journal.open(tmp_path, {"id": 1}, FINGERPRINT).stages  # forgotten on disk


def test_a_missing_file_fails_verification(tmp_path: Path) -> None:
    journal = Journal.open(tmp_path, {}, FINGERPRINT)
    data = tmp_path / "lm_eval.json"
    data.write_text("{}")
    journal.complete("lm_eval", {"sections": []}, [data])
    data.unlink()
    assert Journal.open(tmp_path, {}, FINGERPRINT).completed("lm_eval") is None


def test_a_different_fingerprint_is_refused_naming_what_changed(tmp_path: Path) -> None:
    Journal.open(tmp_path, {}, FINGERPRINT).complete("evaluate", {"metrics": {}})
    changed = {**FINGERPRINT, "libraries": {"torch": "2.14"}}
    with pytest.raises(OutputError, match=r"libraries\.torch: 2\.13 -> 2\.14") as err:
        Journal.open(tmp_path, {}, changed)
    assert "--restart" in err.value.hint
    assert "evaluate" in Journal.open(tmp_path, {}, FINGERPRINT).stages  # untouched


def test_forget_drops_a_stage_and_its_numbered_entries(tmp_path: Path) -> None:
    journal = Journal.open(tmp_path, {}, FINGERPRINT)
    for stage in ("reference", "quantize", "evaluate", "lm_eval.0", "lm_eval.1", "bench"):
        journal.complete(stage, {})
    journal.forget("evaluate", "lm_eval", "bench")
    assert list(Journal.open(tmp_path, {}, FINGERPRINT).stages) == ["reference", "quantize"]


def test_reference_stage_alone_is_not_worth_keeping(tmp_path: Path) -> None:
    journal = Journal.open(tmp_path, {}, FINGERPRINT)
    journal.complete("reference", {"key": "k"})
    assert not journal.holds_work()


def test_writer_lock_excludes_a_second_writer_and_is_seen_by_others(tmp_path: Path) -> None:
    final = tmp_path / "run"
    writer = RunWriter(final)
    writer.open_journal({"cmd": 1}, FINGERPRINT).complete("evaluate", {})
    assert is_locked(partial_dir(final))
    with pytest.raises(OutputError, match="another quantkit process"):
        RunWriter(final)
    assert find_resumable(tmp_path, {"cmd": 1}) is None  # live: not offered for resume
    writer.release()
    assert not is_locked(partial_dir(final))
    assert find_resumable(tmp_path, {"cmd": 1}) == partial_dir(final)
    assert find_resumable(tmp_path, {"cmd": 2}) is None


def test_commit_leaves_no_journal_or_lock(tmp_path: Path) -> None:
    writer = RunWriter(tmp_path / "run")
    writer.open_journal({}, FINGERPRINT)
    writer.write_text("manifest.json", "{}")
    run = writer.commit()
    assert sorted(p.name for p in run.iterdir()) == ["manifest.json"]
    assert not partial_dir(run).exists()


def test_an_unreadable_journal_is_refused_not_reset(tmp_path: Path) -> None:
    (tmp_path / "progress.json").write_text('{"schema_version": 99, "stages": {"quantize": {}}}')
    with pytest.raises(OutputError, match="cannot read") as err:
        Journal.open(tmp_path, {}, FINGERPRINT)
    assert "--restart" in err.value.hint
    assert "99" in (tmp_path / "progress.json").read_text()  # left as it was


def test_files_outside_the_run_are_recorded_by_absolute_path(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "ref.npz").write_bytes(b"ref")
    run = tmp_path / "run"
    run.mkdir()
    journal = Journal.open(run, {}, FINGERPRINT)
    journal.complete("reference", {}, [Path("cache/ref.npz")])  # a relative QUANTKIT_CACHE
    assert list(journal.stages["reference"]["files"]) == [str(tmp_path / "cache" / "ref.npz")]
    monkeypatch.chdir(run)
    assert Journal.open(run, {}, FINGERPRINT).completed("reference") == {}


def test_a_held_partial_is_not_removed(tmp_path: Path) -> None:
    from quantkit.results.store import remove_partial

    writer = RunWriter(tmp_path / "run")
    assert remove_partial(partial_dir(tmp_path / "run")) is False
    assert partial_dir(tmp_path / "run").is_dir()
    writer.release()  # created by this writer and nothing recorded: removed
    assert not partial_dir(tmp_path / "run").exists()
    other = RunWriter(tmp_path / "run")
    other.open_journal({}, FINGERPRINT).complete("evaluate", {})
    other.release()
    assert remove_partial(partial_dir(tmp_path / "run")) is True
    assert list(tmp_path.iterdir()) == []


def _gguf(path: Path) -> Path:
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_string("general.name", "tiny")
    writer.add_tensor("a", np.ones((64, 64), dtype=np.float32))
    writer.add_tensor("b", np.ones((64, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("keep", [2, 40, 300, 20_000, -1])
def test_truncated_gguf_files_are_refused(tmp_path: Path, keep: int) -> None:
    from quantkit.runtimes.llamacpp import check_gguf, gguf_file

    whole = _gguf(tmp_path / "whole.gguf")
    check_gguf(whole)
    data = whole.read_bytes()
    cut = tmp_path / "cut" / "model.gguf"
    cut.parent.mkdir()
    cut.write_bytes(data[:keep])
    with pytest.raises(ArtifactError, match=r"truncated|not a GGUF file"):
        check_gguf(gguf_file(cut.parent))


def test_run_ids_made_in_the_same_second_do_not_collide() -> None:
    """Sweep workers start runs of one recipe at the same moment: ids must still differ, and
    stay sortable by time with the name readable at the end."""
    import re

    from quantkit.results.store import new_run_id

    ids = [new_run_id("gptq w4/g128") for _ in range(50)]
    assert len(set(ids)) == 50
    assert all(re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}-gptq-w4-g128", run_id) for run_id in ids), ids[0]
