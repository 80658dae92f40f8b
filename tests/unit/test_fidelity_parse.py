"""bench/fidelity.py reads llama-perplexity's own summary lines (recorded from a real run)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "fidelity"


def _fidelity():
    spec = importlib.util.spec_from_file_location("fidelity", ROOT / "bench" / "fidelity.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_kl_divergence_summary_is_parsed() -> None:
    figures = _fidelity().parse_kld_output((DATA / "llama-perplexity-q4_k_m.txt").read_text())
    assert figures == {
        "ppl": 19.131799,
        "ppl_base": 18.108725,
        "kld_mean": 0.065819,
        "kld_mean_stderr": 0.001065,
        "same_top_p_pct": 85.676,
    }


def test_plain_run_final_estimate_is_parsed() -> None:
    assert _fidelity().parse_final_ppl((DATA / "llama-perplexity-f16.txt").read_text()) == 18.133


def test_output_without_the_summary_is_an_error() -> None:
    with pytest.raises(ValueError, match="kld_mean"):
        _fidelity().parse_kld_output("Mean PPL(Q) : 1.0\nMean PPL(base) : 1.0\n")


def test_the_fidelity_text_is_the_two_licences() -> None:
    text = (DATA / "licences.txt").read_text(encoding="utf-8")
    assert text.startswith("                    GNU GENERAL PUBLIC LICENSE\n                       Version 3")
    assert "Apache License\n                           Version 2.0, January 2004" in text
