from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from quantkit.errors import RecipeError, RunNotFoundError
from quantkit.inputs.specs import GateSpec
from quantkit.metrics import metric_info
from quantkit.results.gate import (
    Check,
    GateResult,
    evaluate_gate,
    gate_fields,
    load_gate_file,
    load_windows,
    resolve_spec,
    to_junit,
    to_markdown,
)
from quantkit.results.window_scores import WindowScores


def test_all_hold() -> None:
    result = evaluate_gate(
        GateSpec(max_kld_mean=0.1, min_top1_agreement_pct=80), {"kld_mean": 0.05, "top1_agreement_pct": 90.0}
    )
    assert result.passed and len(result.checks) == 2


def test_one_fails_and_is_named() -> None:
    result = evaluate_gate(
        GateSpec(max_kld_mean=0.01, max_ppl_increase_pct=5), {"kld_mean": 0.05, "ppl_increase_pct": 1.0}
    )
    assert not result.passed
    assert [check.metric for check in result.failures] == ["kld_mean"]
    assert "0.05" in result.failures[0].describe() and "0.01" in result.failures[0].describe()


def test_missing_metric_fails() -> None:
    result = evaluate_gate(GateSpec(max_kld_p99=1.0), {"kld_mean": 0.0})
    assert not result.passed
    assert "missing" in result.failures[0].describe()


def test_nan_metric_fails() -> None:
    assert not evaluate_gate(GateSpec(max_kld_mean=1.0), {"kld_mean": float("nan")}).passed


def test_boundary_values_pass() -> None:
    assert evaluate_gate(
        GateSpec(max_kld_mean=0.05, min_top1_agreement_pct=90), {"kld_mean": 0.05, "top1_agreement_pct": 90.0}
    ).passed


# --- new thresholds, layering, gate files, significance, outputs ------------------------------


def test_benchmark_thresholds() -> None:
    spec = GateSpec(
        min_task_recovery_pct=98,
        min_decode_speed_ratio=1.2,
        min_prefill_speed_ratio=1.0,
        max_peak_memory_bytes=8_000_000_000,
        max_memory_ratio=0.6,
    )
    metrics = {
        "task_recovery_pct": 99.0,
        "decode_speed_ratio": 1.5,
        "prefill_speed_ratio": 0.9,
        "peak_memory_bytes": 9e9,
        "memory_ratio": 0.5,
    }
    result = evaluate_gate(spec, metrics)
    assert len(result.checks) == 5
    assert [check.metric for check in result.failures] == ["peak_memory_bytes", "prefill_speed_ratio"]


def test_missing_benchmark_metric_fails_naming_it() -> None:
    result = evaluate_gate(GateSpec(min_decode_speed_ratio=1.0), {"kld_mean": 0.0})
    assert not result.passed
    assert result.failures[0].verdict == "missing"
    assert "decode_speed_ratio: missing" in result.failures[0].describe()


def test_every_gate_field_bounds_a_registered_metric_in_its_direction() -> None:
    for field, (metric, kind) in gate_fields().items():
        info = metric_info(metric)  # unit, direction and relative/absolute come from the registry
        assert kind == ("min" if info.higher_is_better else "max") == field[:3], field
        assert field == f"{kind}_{metric}"  # named after the metric it bounds
    assert set(gate_fields()) == {name for name in GateSpec.model_fields if name.startswith(("max_", "min_"))}
    assert metric_info("ppl_increase_pct").relative and not metric_info("kld_mean").relative


def test_options_alone_are_an_empty_gate() -> None:
    assert GateSpec(require_significance=True, confidence=0.9, seed=3).is_empty()
    assert not GateSpec(max_memory_ratio=1.0).is_empty()


def test_old_checks_and_results_still_construct_positionally() -> None:
    check = Check("kld_mean", "max", 0.1, 0.2, False)
    assert check.verdict == "fail" and check.interval is None
    assert GateResult([check]).to_dict()["checks"][0]["metric"] == "kld_mean"


def test_layers_override_field_by_field() -> None:
    spec, sources = resolve_spec(
        [
            ("recipe", {"max_kld_mean": 0.1, "max_ppl_increase_pct": 5.0, "min_top1_agreement_pct": None}),
            (
                "gate-file",
                {"max_kld_mean": 0.05, "min_top1_agreement_pct": 90.0, "max_ppl_increase_pct": None},
            ),
            ("flag", {"max_kld_mean": 0.5, "require_significance": True}),
        ]
    )
    assert (
        spec.max_kld_mean == 0.5 and spec.min_top1_agreement_pct == 90.0 and spec.max_ppl_increase_pct is None
    )
    assert spec.require_significance is True
    assert sources == {
        "max_kld_mean": "flag",
        "min_top1_agreement_pct": "gate-file",
        "require_significance": "flag",
    }


def test_layers_are_validated() -> None:
    with pytest.raises(RecipeError, match="confidence"):
        resolve_spec([("flag", {"confidence": 1.5, "max_kld_mean": 1.0})])


def _gate_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gates.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_gate_file_sets_only_what_it_names(tmp_path: Path) -> None:
    spec = load_gate_file(
        _gate_file(tmp_path, "max_kld_mean: 0.05\nmin_top1_pct: null\nrequire_significance: true\n")
    )
    assert spec.max_kld_mean == 0.05 and spec.require_significance
    assert spec.model_fields_set == {"max_kld_mean", "min_top1_agreement_pct", "require_significance"}


def test_gate_file_may_wrap_fields_in_gates(tmp_path: Path) -> None:
    assert load_gate_file(_gate_file(tmp_path, "gates:\n  max_kld_mean: 0.1\n")).max_kld_mean == 0.1
    with pytest.raises(RecipeError) as err:
        load_gate_file(_gate_file(tmp_path, "gates:\n  max_kdl_mean: 0.1\n"))
    assert "gates.max_kdl_mean" in err.value.message and "max_kld_mean" in err.value.hint


@pytest.mark.parametrize(
    ("text", "message", "hint"),
    [
        ("max_kdl_mean: 0.1\n", "unknown field 'max_kdl_mean'", "did you mean 'max_kld_mean'?"),
        ("min_top1: 90\n", "unknown field 'min_top1'", "did you mean 'min_top1_agreement_pct'?"),
        ("max_kld_mean: [0.1\n", "malformed YAML at line 2", "fix the YAML"),
        ("max_kld_mean: -1\n", "invalid value for 'max_kld_mean'", "gate file"),
        ("", "gate file is empty", "max_kld_mean"),
        ("- max_kld_mean: 1\n", "must be a YAML mapping", "max_kld_mean"),
        ("a: &x 1\nmax_kld: *x\n", "aliases", "fix the YAML"),
    ],
)
def test_bad_gate_files(tmp_path: Path, text: str, message: str, hint: str) -> None:
    with pytest.raises(RecipeError) as err:
        load_gate_file(_gate_file(tmp_path, text))
    assert message in err.value.message and hint in err.value.hint
    assert err.value.exit_code == 2


def test_missing_gate_file(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="cannot read"):
        load_gate_file(tmp_path / "nope.yaml")


def _windows(shift: float, kld: float = 0.01, n: int = 20, spread: float = 0.002) -> dict[str, Any]:
    base = [3.0 + 0.2 * math.sin(i) for i in range(n)]
    wobble = [spread * math.cos(3 * i) for i in range(n)]
    return {
        "schema_version": 1,
        "positions_per_window": 63,
        "baseline": {"nll_mean": base},
        "quantized": {
            "nll_mean": [b + shift + w for b, w in zip(base, wobble, strict=True)],
            "kld_mean": [kld + w for w in wobble],
            "top1_agreement": [0.9 + w for w in wobble],
        },
    }


def typed(windows: dict[str, Any]) -> WindowScores:
    return WindowScores.model_validate(windows)


def _metrics(windows: dict[str, Any]) -> dict[str, float]:
    base, quant = windows["baseline"]["nll_mean"], windows["quantized"]["nll_mean"]
    ppl_b, ppl_q = math.exp(sum(base) / len(base)), math.exp(sum(quant) / len(quant))
    kld, top1 = windows["quantized"]["kld_mean"], windows["quantized"]["top1_agreement"]
    return {
        "ppl_increase_pct": 100 * (ppl_q / ppl_b - 1),
        "kld_mean": sum(kld) / len(kld),
        "top1_agreement_pct": 100 * sum(top1) / len(top1),
    }


def test_intervals_are_recorded_without_changing_point_verdicts() -> None:
    windows = _windows(shift=0.01)
    result = evaluate_gate(
        GateSpec(max_kld_mean=0.0101, max_ppl_increase_pct=0.9), _metrics(windows), typed(windows)
    )
    by_metric = {check.metric: check for check in result.checks}
    low, high = by_metric["ppl_increase_pct"].interval or [0, 0]
    assert low < by_metric["ppl_increase_pct"].value < high  # type: ignore[operator]
    assert by_metric["ppl_increase_pct"].verdict == "fail"  # point value 1.0% > 0.9%, not required
    assert result.significance is not None and result.significance.windows == 20


def test_significance_clear_pass_clear_fail_and_inconclusive() -> None:
    windows = _windows(shift=0.01)  # ~ +1.0% perplexity, interval roughly [0.9, 1.1]
    metrics = _metrics(windows)
    interval = evaluate_gate(GateSpec(max_ppl_increase_pct=0), metrics, typed(windows)).checks[0].interval
    assert interval is not None and 0.5 < interval[0] < 1.005 < interval[1] < 1.5

    def verdict(threshold: float, strict: bool = False) -> tuple[str, bool]:
        spec = GateSpec(max_ppl_increase_pct=threshold, require_significance=True, strict_inconclusive=strict)
        check = evaluate_gate(spec, metrics, typed(windows)).checks[0]
        return check.verdict, check.passed

    assert verdict(2.0) == ("pass", True)
    assert verdict(0.5) == ("fail", False)
    assert verdict(1.0) == ("inconclusive", True)  # the point value 1.005 alone would fail
    assert verdict(1.0, strict=True) == ("inconclusive", False)


def test_significance_on_min_checks() -> None:
    windows = _windows(shift=0.0)  # top-1 agreement ~90%
    metrics = _metrics(windows)

    def verdict(threshold: float) -> str:
        spec = GateSpec(min_top1_agreement_pct=threshold, require_significance=True)
        return evaluate_gate(spec, metrics, typed(windows)).checks[0].verdict

    assert verdict(80) == "pass" and verdict(95) == "fail" and verdict(90.0) == "inconclusive"


def test_checks_without_an_interval_use_the_point_value() -> None:
    windows = _windows(shift=0.0)
    spec = GateSpec(max_kld_p99=0.1, min_decode_speed_ratio=1.0, require_significance=True)
    result = evaluate_gate(spec, {"kld_p99": 0.2, "decode_speed_ratio": 1.1}, typed(windows))
    assert [(c.metric, c.verdict, c.interval) for c in result.checks] == [
        ("kld_p99", "fail", None),
        ("decode_speed_ratio", "pass", None),
    ]


def test_required_significance_without_windows_is_noted() -> None:
    result = evaluate_gate(GateSpec(max_kld_mean=1.0, require_significance=True), {"kld_mean": 0.5})
    assert result.passed and result.checks[0].interval is None
    assert "no per-window scores" in result.notes[0]


def test_too_few_windows_are_noted_not_fatal() -> None:
    windows = _windows(shift=0.0, n=1)
    result = evaluate_gate(
        GateSpec(max_kld_mean=1.0, require_significance=True), _metrics(windows), typed(windows)
    )
    assert result.passed and any("at least 2 windows" in note for note in result.notes)


def test_load_windows(tmp_path: Path) -> None:
    assert load_windows(tmp_path) is None
    (tmp_path / "eval_windows.json").write_text(json.dumps(_windows(0.0)))
    assert load_windows(tmp_path) is not None
    damaged = _windows(0.0)
    damaged["quantized"]["kld_mean"] = damaged["quantized"]["kld_mean"][:-1]
    (tmp_path / "eval_windows.json").write_text(json.dumps(damaged))
    with pytest.raises(RunNotFoundError, match="window counts differ"):
        load_windows(tmp_path)
    (tmp_path / "eval_windows.json").write_text("{")
    with pytest.raises(RunNotFoundError, match="not valid JSON"):
        load_windows(tmp_path)


def _two_results() -> list[tuple[str, GateResult]]:
    windows = _windows(shift=0.01)
    metrics = _metrics(windows)
    good = evaluate_gate(GateSpec(max_kld_mean=1.0, max_ppl_increase_pct=5), metrics, typed(windows))
    bad = evaluate_gate(
        GateSpec(max_kld_mean=0.001, min_decode_speed_ratio=1.0, min_top1_agreement_pct=10), metrics
    )
    return [("runs/good", good), ("runs/a|b", bad)]


def test_junit_counts_and_failures() -> None:
    root = ET.fromstring(to_junit(_two_results()))
    assert root.tag == "testsuites" and root.get("tests") == "5" and root.get("failures") == "2"
    suites = root.findall("testsuite")
    assert [(s.get("name"), s.get("tests"), s.get("failures")) for s in suites] == [
        ("runs/good", "2", "0"),
        ("runs/a|b", "3", "2"),
    ]
    cases = suites[1].findall("testcase")
    assert [case.get("name") for case in cases] == ["kld_mean", "top1_agreement_pct", "decode_speed_ratio"]
    failures = [case.find("failure") for case in cases]
    assert failures[1] is None
    assert failures[0] is not None and "kld_mean" in (failures[0].get("message") or "")
    assert failures[2] is not None and "missing" in (failures[2].get("message") or "")


def test_markdown_table() -> None:
    text = to_markdown(_two_results())
    assert text.startswith("## quantkit gate: failed")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) == 5
    assert "| run | metric | value | threshold | interval | verdict |" in text
    assert "`runs/a\\|b`" in text  # pipes escaped
    assert "❌ FAIL (missing)" in text and "≤ +5.00%" in text  # the metric registry's format
    assert "95% bootstrap intervals over 20 eval windows" in text


def test_old_gate_field_names_still_read_with_a_note() -> None:
    """Gate fields are named after the metric they bound; recipes and gate files of before
    (``max_kld``, ``min_top1_pct``, the served ``max_ttft_p95``) still work and say so."""
    spec = GateSpec.model_validate({"max_kld": 0.1, "min_top1_pct": 90, "max_ttft_p95": 0.8})
    assert spec.thresholds() == {
        "max_kld_mean": 0.1,
        "min_top1_agreement_pct": 90.0,
        "max_serve_ttft_p95_s": 0.8,
    }
    assert spec.deprecation_notes() == [
        "gate field 'max_kld' is now 'max_kld_mean' (the old name still works)",
        "gate field 'min_top1_pct' is now 'min_top1_agreement_pct' (the old name still works)",
        "gate field 'max_ttft_p95' is now 'max_serve_ttft_p95_s' (the old name still works)",
    ]
    assert GateSpec.model_validate({"max_kld_mean": 0.1}).deprecation_notes() == []
    assert [c.field for c in evaluate_gate(spec, {"kld_mean": 0.2}).checks][:1] == ["max_kld_mean"]


def test_docs_metric_table_is_made_from_the_registry() -> None:
    from quantkit.metrics.table import markdown

    docs = Path(__file__).parents[2] / "docs" / "metrics.md"
    assert docs.read_text(encoding="utf-8") == markdown(), (
        "run: python -m quantkit.metrics.table > docs/metrics.md"
    )
