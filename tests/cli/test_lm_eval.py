"""lm-eval on the tiny model: the shipped offline task, recovery, caching, unknown tasks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import require_extra

from quantkit.cli import main

require_extra("lm_eval", "lm-eval")


def recipe(tmp_path: Path, tiny_model: Path, tasks: str = "[quantkit_cloze]") -> Path:
    path = tmp_path / "lm.yaml"
    path.write_text(
        f"""
name: tiny-lm
method: fp8
model: {tiny_model}
device: cpu
eval: {{num_windows: 2, seq_len: 32, top_k: 4}}
evals:
  - lm_eval: {{tasks: {tasks}, limit: 8, batch_size: 4}}
gates: {{min_task_recovery_pct: 95}}
""",
        encoding="utf-8",
    )
    return path


def test_quantize_runs_lm_eval_and_records_recovery(tmp_path: Path, tiny_model: Path, capsys) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    assert main(["quantize", str(recipe(tmp_path, tiny_model)), "--out", str(first)]) == 0
    manifest = json.loads((first / "manifest.json").read_text())
    section = manifest["lm_eval"][0]
    for side in ("baseline", "artifact"):
        entry = section[side]["quantkit_cloze"]
        assert entry["metric"] == "acc_norm" and 0 <= entry["value"] <= 1 and entry["stderr"] is not None
    recovery = manifest["metrics"]["quantized"]["task_recovery_pct"]
    # FP8 moves the tiny model's distributions by a KLD of ~1e-5: it picks the same answers
    base, art = (section[side]["quantkit_cloze"]["value"] for side in ("baseline", "artifact"))
    assert base > 0 and art == base
    assert recovery["higher_is_better"] is True and recovery["value"] == pytest.approx(100.0)
    assert "task_recovery_pct:quantkit_cloze" in manifest["metrics"]["quantized"]
    samples = (first / "lm_eval" / "quantkit_cloze.jsonl").read_text().splitlines()
    assert len(samples) == 8 and "resps" in json.loads(samples[0])
    assert manifest["gate"]["passed"] is True
    # the baseline's task results are cached: a second recipe on the same model reuses them
    assert main(["quantize", str(recipe(tmp_path, tiny_model)), "--out", str(second), "--set", "seed=1"]) == 0
    again = json.loads((second / "manifest.json").read_text())["lm_eval"][0]
    assert again["baseline_cached"] is True and again["baseline"] == section["baseline"]


def test_unknown_task_fails_before_quantizing(tmp_path: Path, tiny_model: Path, capsys) -> None:
    out = tmp_path / "x"
    code = main(["quantize", str(recipe(tmp_path, tiny_model, "[quantkit_clozee]")), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert "lm-eval does not know task 'quantkit_clozee'" in err and "quantkit_cloze" in err
    assert not out.exists()


def test_eval_command_on_a_stored_run(tmp_path: Path, tiny_recipe: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["quantize", str(tiny_recipe), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["eval", str(out), "--tasks", "quantkit_cloze", "--limit", "6", "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)[0]
    assert set(result["recovery_pct"]) == {"quantkit_cloze"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["metrics"]["quantized"]["task_recovery_pct"]["value"] == pytest.approx(
        result["recovery_pct"]["quantkit_cloze"]
    )
    assert result["recovery_pct"]["quantkit_cloze"] == pytest.approx(100.0)  # same answers (FP8, tiny)
    assert main(["gate", str(out), "--min-task-recovery", "99%"]) == 0
    assert main(["gate", str(out), "--min-task-recovery", "101%"]) == 1


def test_recovery_inverts_lower_is_better_metrics() -> None:
    from quantkit.evals.lm_eval_runner import recovery
    from quantkit.results.manifest import TaskResult

    def task(value: float, higher: bool) -> TaskResult:
        return TaskResult(metric="m", value=value, stderr=None, higher_is_better=higher)

    base = {"a": task(0.5, True), "p": task(10.0, False)}
    quant = {"a": task(0.4, True), "p": task(12.5, False)}
    assert recovery(base, quant) == {"a": pytest.approx(80.0), "p": pytest.approx(80.0)}


def test_each_lm_eval_entry_is_a_stage_a_resume_keeps(
    tmp_path: Path, tiny_model: Path, capsys, monkeypatch
) -> None:
    from quantkit.evals import lm_eval_runner

    path = recipe(tmp_path, tiny_model)
    path.write_text(
        path.read_text().replace(
            "evals:\n", "evals:\n  - lm_eval: {tasks: [quantkit_cloze], limit: 4, batch_size: 4}\n"
        )
    )
    real = lm_eval_runner.evaluate

    def interrupted_on_the_second(model, spec, *args):
        if spec.limit == 8:
            raise KeyboardInterrupt
        return real(model, spec, *args)

    out = tmp_path / "run"
    monkeypatch.setattr(lm_eval_runner, "evaluate", interrupted_on_the_second)
    assert main(["quantize", str(path), "--out", str(out)]) == 130
    progress = json.loads((tmp_path / ".run.partial" / "progress.json").read_text())
    assert list(progress["stages"]) == ["reference", "quantize", "evaluate", "lm_eval.0"]
    monkeypatch.setattr(lm_eval_runner, "evaluate", real)
    assert main(["quantize", str(path), "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert "lm_eval.0" in manifest["resume"]["resumed_stages"]
    assert "lm_eval.1" not in manifest["resume"]["resumed_stages"]
    assert [section["settings"]["limit"] for section in manifest["lm_eval"]] == [4, 8]
    assert len((out / "lm_eval" / "quantkit_cloze.jsonl").read_text().splitlines()) == 4
    assert len((out / "lm_eval" / "entry-1" / "quantkit_cloze.jsonl").read_text().splitlines()) == 8


def test_nextword_task_scores_the_word_after_a_space_and_json_stays_clean(
    tmp_path: Path, tiny_recipe: Path, capsys
) -> None:
    """quantkit_nextword asks for " word" after the context (LAMBADA's target), and lm-eval's
    own prints (its bootstrap notice for perplexity) never reach --format json's stdout."""
    run = tmp_path / "run"
    assert main(["quantize", str(tiny_recipe), "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--tasks", "quantkit_nextword", "--limit", "8", "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)[0]  # stdout is the JSON document and nothing else
    entry = result["baseline"]["quantkit_nextword"]
    assert entry["metric"] == "acc" and entry["stderr"] is not None
    rows = [
        json.loads(line) for line in (run / "lm_eval" / "quantkit_nextword.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 8
    for row in rows:
        context, target = row["arguments"][0]
        assert target == " " + row["doc"]["word"] and not context.endswith(" ")
