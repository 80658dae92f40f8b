from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from quantkit.calibration import eval_windows
from quantkit.evals import reference as ref
from quantkit.evals.quality import baseline_metrics, score, summarize
from quantkit.recipe import EvalSpec
from quantkit.runtimes.hf import HFRuntime


@pytest.fixture(scope="module")
def setup(tiny_model: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    windows = eval_windows(EvalSpec(num_windows=3, seq_len=48), tokenizer)
    runtime = HFRuntime(tiny_model, "cpu")
    return runtime, windows


def _perturbed(runtime: HFRuntime, scale: float):
    """A second model: the same network with its logits tempered (a controlled distortion)."""

    def log_probs(ids):
        with torch.inference_mode():
            logits = runtime.model(input_ids=ids).logits.float()
        return torch.log_softmax(logits * scale, dim=-1)

    return log_probs


def test_baseline_against_itself_has_zero_distance(setup) -> None:
    runtime, windows = setup
    reference = ref.compute(runtime.log_probs, windows, top_k=8, batch_size=2, key="k")
    metrics = summarize(score(runtime.log_probs, windows, reference, 2), baseline_metrics(reference)["ppl"])
    assert metrics["kld_mean"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["top1_agreement_pct"] == 100.0
    assert metrics["ppl_increase_pct"] == pytest.approx(0.0, abs=1e-4)
    assert metrics["tokens"] == 3 * 47


def test_perplexity_matches_transformers_loss(setup) -> None:
    runtime, windows = setup
    reference = ref.compute(runtime.log_probs, windows, top_k=8, batch_size=2, key="k")
    ids = torch.as_tensor(windows.ids)
    with torch.inference_mode():
        losses = [runtime.model(input_ids=row[None], labels=row[None]).loss.item() for row in ids]
    independent = math.exp(sum(losses) / len(losses))  # equal-length windows: mean of means
    assert baseline_metrics(reference)["ppl"] == pytest.approx(independent, rel=1e-5)
    scored = summarize(score(runtime.log_probs, windows, reference, 3), 1.0)
    assert scored["ppl"] == pytest.approx(independent, rel=1e-5)


def test_compact_kld_is_exact_when_k_covers_the_vocabulary(setup) -> None:
    runtime, windows = setup
    vocab = runtime.model.config.vocab_size
    other = _perturbed(runtime, 0.7)
    full = ref.compute(runtime.log_probs, windows, top_k=vocab, batch_size=3, key="full")
    compact = ref.compute(runtime.log_probs, windows, top_k=16, batch_size=3, key="compact")
    p = runtime.log_probs(torch.as_tensor(windows.ids))[:, :-1]
    q = other(torch.as_tensor(windows.ids))[:, :-1]
    exact = (p.exp() * (p - q)).sum(-1).mean().item()
    assert score(other, windows, full, 3).kld.mean() == pytest.approx(exact, rel=1e-4)
    approx = score(other, windows, compact, 3).kld.mean()
    assert 0 < approx <= exact * 1.0001  # the top-k + rest estimate is a lower bound


def test_a_distorted_model_scores_worse(setup) -> None:
    runtime, windows = setup
    reference = ref.compute(runtime.log_probs, windows, top_k=8, batch_size=3, key="k")
    metrics = summarize(score(_perturbed(runtime, 4.0), windows, reference, 3), 1.0)
    assert metrics["kld_mean"] > 0.01
    assert metrics["kld_p99"] >= metrics["kld_median"]


def test_reference_cache_roundtrip(setup) -> None:
    runtime, windows = setup
    key = ref.reference_key("fingerprint", windows, 8, "cpu")
    assert ref.load_cached(key) is None
    reference = ref.compute(runtime.log_probs, windows, top_k=8, batch_size=2, key=key)
    ref.save(reference)
    cached = ref.load_cached(key)
    assert cached is not None
    assert np.array_equal(cached.topk_ids, reference.topk_ids)
    assert np.allclose(cached.rest_logmass, reference.rest_logmass)
    assert ref.reference_key("fingerprint", windows, 16, "cpu") != key
