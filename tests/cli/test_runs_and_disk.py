"""`quantkit runs`, the disk-space check, and determinism of a run on the CPU."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from quantkit.cli import main


def test_runs_list_show_and_clean(tiny_recipe: Path, tmp_path: Path, capsys) -> None:
    runs = tmp_path / "runs"
    assert main(["quantize", str(tiny_recipe)]) == 0
    (runs / ".dead.partial-abc").mkdir()
    old = runs / ".dead.partial-old"
    old.mkdir()
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    capsys.readouterr()
    assert main(["runs", "list", "--format", "json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [row["status"] for row in listing["runs"]] == ["complete"]
    assert sorted(item["folder"] for item in listing["leftovers"]) == [
        ".dead.partial-abc",
        ".dead.partial-old",
    ]
    assert not any(item["running"] for item in listing["leftovers"])
    run = runs / listing["runs"][0]["run"]
    assert main(["runs", "show", str(run), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "complete"
    assert main(["runs", "clean"]) == 0
    assert not old.exists() and (runs / ".dead.partial-abc").exists() and run.exists()


def test_full_disk_is_refused_before_any_work(tiny_recipe: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    import quantkit.results.store

    full = shutil._ntuple_diskusage(total=10**12, used=10**12 - 1000, free=1000)  # type: ignore[attr-defined]
    monkeypatch.setattr(quantkit.results.store.shutil, "disk_usage", lambda path: full)
    out = tmp_path / "out"
    assert main(["quantize", str(tiny_recipe), "--out", str(out)]) == 2
    assert "not enough disk space" in capsys.readouterr().err
    assert not out.exists() and list(tmp_path.glob(".out.partial*")) == []


def test_same_recipe_and_seed_give_identical_artifacts_and_metrics(tiny_recipe: Path, tmp_path: Path) -> None:
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        assert main(["quantize", str(tiny_recipe), "--out", str(out), "--set", "options.scheme=FP8"]) == 0
    first, second = (json.loads((out / "manifest.json").read_text()) for out in outs)
    assert first["metrics"] == second["metrics"]
    assert first["calibration"]["hash"] == second["calibration"]["hash"]
    weights = [(out / "artifact" / "model.safetensors").read_bytes() for out in outs]
    assert weights[0] == weights[1]
