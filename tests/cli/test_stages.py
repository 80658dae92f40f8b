"""One pipeline of stages: `eval RUN` and `bench RUN` update a finished run the way quantize
finalizes one, stage dependencies drive invalidation, and a runtime is one file + one line."""

from __future__ import annotations

import fcntl
import json
from pathlib import Path

import pytest
from conftest import write_tiny_recipe

from quantkit.cli import main


def run_cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    code = main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def test_eval_run_then_gate_judges_the_updated_recovery(tmp_path: Path, tiny_model: Path, capsys) -> None:
    """quantize fails its recipe gate (no task recovery yet); eval RUN adds the lm-eval stage,
    and the run's gate verdict, report and stage records follow."""
    recipe = write_tiny_recipe(tmp_path, tiny_model)
    recipe.write_text(
        recipe.read_text().replace(
            "gates: {max_kld_mean: 0.005}", "gates: {max_kld_mean: 0.005, min_task_recovery_pct: 50}"
        )
    )
    run = tmp_path / "run"
    code, _, err = run_cli(capsys, "quantize", recipe, "--out", run)
    assert code == 1 and "task_recovery_pct: missing" in err
    before = manifest(run)
    assert before["gate"]["passed"] is False
    code, out, err = run_cli(
        capsys, "eval", run, "--tasks", "quantkit_cloze", "--limit", "4", "--format", "json"
    )
    assert code == 0, err
    result = json.loads(out)[0]
    updated = manifest(run)
    recovery = updated["metrics"]["quantized"]["task_recovery_pct"]["value"]
    assert recovery == pytest.approx(result["recovery_pct"]["quantkit_cloze"]) == result["task_recovery_pct"]
    assert updated["gate"]["passed"] is True  # the recorded verdict is current, not stale
    # what the earlier stages recorded survives the update: the baseline's own figures and
    # verdict, the KLD estimator and tail samples (they were lost when a run was restored)
    assert updated["metrics"]["baseline"] == before["metrics"]["baseline"]
    assert set(before["metrics"]["baseline"]) >= {"top1_accuracy_pct", "unigram_ppl", "unigram_top1_pct"}
    for key in ("baseline_check", "kld_estimator", "tail_samples", "tokenizer_check", "deployment"):
        assert updated["eval"][key] == before["eval"][key], key
    assert before["eval"]["kld_estimator"] == "sampled-tail" and before["eval"]["baseline_check"] is not None
    checks = {check["metric"]: check for check in updated["gate"]["checks"]}
    assert checks["task_recovery_pct"]["value"] == recovery
    assert updated["recipe"]["evals"][0]["lm_eval"]["limit"] == 4  # the manifest says what ran
    assert "lm-eval recovery %" in (run / "report.md").read_text()
    assert json.loads((run / "report.json").read_text())["rows"][1]["task_recovery_pct"] == recovery
    assert "lm_eval/quantkit_cloze.jsonl" in updated["stages"]["lm_eval.0"]["files"]
    assert run_cli(capsys, "gate", run)[0] == 0
    code, out, _ = run_cli(capsys, "gate", run, "--min-task-recovery", f"{recovery + 1}%")
    assert code == 1 and "task_recovery_pct" in out
    code, out, _ = run_cli(capsys, "runs", "show", run)
    assert code == 0 and "stage lm_eval.0" in out and "lm_eval/quantkit_cloze.jsonl" in out
    # the same settings again redo the same entry; other settings add one. task_recovery_pct is
    # the mean over tasks of each task's latest entry (here: quantkit_cloze at limit 6)
    assert run_cli(capsys, "eval", run, "--tasks", "quantkit_cloze", "--limit", "4")[0] == 0
    assert len(manifest(run)["lm_eval"]) == 1
    assert run_cli(capsys, "eval", run, "--tasks", "quantkit_cloze", "--limit", "6")[0] == 0
    again = manifest(run)
    assert [entry["settings"]["limit"] for entry in again["lm_eval"]] == [4, 6]
    assert (run / "lm_eval" / "entry-1" / "quantkit_cloze.jsonl").is_file()
    assert len((run / "lm_eval" / "quantkit_cloze.jsonl").read_text().splitlines()) == 4  # entry 0 kept
    assert set(again["stages"]) >= {"reference", "quantize", "evaluate", "lm_eval.0", "lm_eval.1"}
    from quantkit.evals.lm_eval_runner import recovery
    from quantkit.results.manifest import TaskResult

    latest = again["lm_eval"][1]
    sides = [
        {t: TaskResult.model_validate(r) for t, r in latest[k].items()} for k in ("baseline", "artifact")
    ]
    expected = recovery(*sides)["quantkit_cloze"]
    assert again["metrics"]["quantized"]["task_recovery_pct"]["value"] == pytest.approx(expected)
    _schema_2_sections_restore_the_same_results(run)


def _schema_2_sections_restore_the_same_results(run: Path) -> None:
    """The run as a schema-2 manifest recorded it (no result in its stage records) is rebuilt
    from its sections into the same stage results the schema-3 records hold (seconds aside:
    schema 2 kept one lm-eval total)."""
    from quantkit.results.manifest import Manifest
    from quantkit.stages.restore import restore

    current = Manifest.model_validate_json((run / "manifest.json").read_text())
    old = current.model_copy(deep=True)
    old.schema_version = 2
    for record in old.stages.values():
        record.result = None
    results, entries = restore(current, run)
    rebuilt, old_entries = restore(old, run)
    names = [name for name, _ in results.items()]
    assert names == [name for name, _ in rebuilt.items()] == sorted(names)
    assert set(names) >= {"reference", "quantize", "evaluate", "lm_eval.0", "lm_eval.1"}
    for (name, result), (_, again) in zip(results.items(), rebuilt.items(), strict=True):
        assert result.model_dump(exclude={"seconds"}) == again.model_dump(exclude={"seconds"}), name
    assert set(entries) == set(old_entries)


def test_a_run_being_updated_is_locked(tmp_path: Path, tiny_recipe: Path, capsys) -> None:
    run = tmp_path / "run"
    assert run_cli(capsys, "quantize", tiny_recipe, "--out", run)[0] == 0
    before = (run / "manifest.json").read_bytes()
    with (run / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running bench RUN would
        code, _, err = run_cli(capsys, "eval", run, "--tasks", "quantkit_cloze", "--limit", "4")
        assert code == 2 and "another quantkit process is updating" in err
    assert (run / "manifest.json").read_bytes() == before


def test_redoing_a_stage_drops_what_depended_on_it() -> None:
    from quantkit.stages.runner import dependents

    recorded = ["reference", "quantize", "evaluate", "lm_eval.0", "lm_eval.1", "bench"]
    assert dependents("quantize", recorded) == ["evaluate", "lm_eval.0", "lm_eval.1", "bench"]
    assert dependents("reference", recorded) == ["evaluate"]
    assert dependents("evaluate", recorded) == [] and dependents("bench", recorded) == []


def test_a_toy_runtime_is_one_file_and_one_registry_line(tmp_path: Path, tiny_recipe: Path, capsys) -> None:
    """tests/toy_runtime.py answers like an endpoint (its own top-k only); registered with one
    line, a run scored through it agrees with the same artifact scored by transformers."""
    from quantkit.runtimes import RUNTIMES

    RUNTIMES.register("toy", "toy_runtime:TopKOnlyRuntime")
    try:
        full, toy = tmp_path / "full", tmp_path / "toy"
        # the full path with the same estimator the toy gets (top-k + rest, no tail sample)
        bound = ["--set", "eval.tail_samples=0"]
        assert run_cli(capsys, "quantize", tiny_recipe, "--out", full, *bound)[0] == 0
        code, _, err = run_cli(capsys, "quantize", tiny_recipe, "--out", toy, "--set", "eval.runtime=toy")
        assert code == 0, err
    finally:
        RUNTIMES.unregister("toy")
    exact, estimated = manifest(full), manifest(toy)
    assert estimated["eval"]["runtime"] == "toy" and exact["eval"]["runtime"] == "hf"
    assert estimated["eval"]["kld_estimator"] == exact["eval"]["kld_estimator"] == "top-k+rest"
    code, out, _ = run_cli(capsys, "report", toy, "--format", "json")
    assert code == 0 and "top-k + rest estimate, a lower bound" in out  # the report says so
    values = {name: entry["value"] for name, entry in estimated["metrics"]["quantized"].items()}
    reference = {name: entry["value"] for name, entry in exact["metrics"]["quantized"].items()}
    assert values["ppl"] == pytest.approx(reference["ppl"], rel=1e-6)
    assert values["top1_agreement_pct"] == reference["top1_agreement_pct"]
    assert values["kld_mean"] == pytest.approx(reference["kld_mean"], rel=0.05)


def test_an_unknown_eval_runtime_is_refused(tmp_path: Path, tiny_recipe: Path, capsys) -> None:
    code, _, err = run_cli(
        capsys, "quantize", tiny_recipe, "--out", tmp_path / "x", "--set", "eval.runtime=vllm"
    )
    assert code == 2 and "unknown runtime 'vllm'" in err and "hint:" in err
    assert not (tmp_path / "x").exists()


def test_one_model_in_memory_at_a_time(tmp_path: Path, tiny_recipe: Path, capsys, monkeypatch) -> None:
    """Every model a stage loaded is freed before the next stage loads one: the baseline's
    after the reference, the quantization model (which llm-compressor's session would keep)
    before the artifact is evaluated, and the artifact's by the end of the run (issue #35)."""
    import weakref

    from transformers import GenerationMixin, PreTrainedModel

    from quantkit.runtimes.hf import HFRuntime

    made: list[weakref.ref[PreTrainedModel]] = []
    alive_at_load: list[int] = []
    real_init, real_load = PreTrainedModel.__init__, HFRuntime.load.__func__

    def recording_init(self: PreTrainedModel, *args: object, **kwargs: object) -> None:
        real_init(self, *args, **kwargs)
        if isinstance(self, GenerationMixin):  # a whole causal LM, not its inner LlamaModel
            made.append(weakref.ref(self))

    def checked_load(cls: type[HFRuntime], *args: object, **kwargs: object) -> HFRuntime:
        alive_at_load.append(sum(ref() is not None for ref in made))
        return real_load(cls, *args, **kwargs)

    monkeypatch.setenv("QUANTKIT_CACHE", str(tmp_path / "cache"))  # the reference is computed, not reused
    monkeypatch.setattr(PreTrainedModel, "__init__", recording_init)
    monkeypatch.setattr(HFRuntime, "load", classmethod(checked_load))
    code, _, err = run_cli(capsys, "quantize", tiny_recipe, "--out", tmp_path / "run", "--no-bench")
    assert code == 0, err
    assert len(made) == 3  # baseline, quantization model, artifact
    assert alive_at_load == [0, 0]  # the reference's load, the evaluation's load
    assert [ref() for ref in made] == [None, None, None]
