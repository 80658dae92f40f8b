from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from toy_runtime import TemperedRuntime, TopKOnlyRuntime

from quantkit.evals import reference as ref
from quantkit.evals.quality import baseline_metrics, score, summarize
from quantkit.evals.quality import targets as scored_targets
from quantkit.inputs.calibration import eval_windows
from quantkit.inputs.specs import EvalSpec
from quantkit.runtimes.base import RuntimeSettings
from quantkit.runtimes.hf import HFRuntime

SETTINGS = RuntimeSettings(device="cpu", context_length=48)


@pytest.fixture(scope="module")
def setup(tiny_model: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    windows = eval_windows(EvalSpec(num_windows=3, seq_len=48), tokenizer)
    return HFRuntime.load(tiny_model, SETTINGS), windows


def _tempered(runtime: HFRuntime, scale: float) -> TemperedRuntime:
    """A second model: the same network with its logits tempered (a controlled distortion)."""
    tempered = TemperedRuntime(runtime.model, runtime.path, SETTINGS)
    tempered.scale = scale
    return tempered


def _log_probs(runtime: HFRuntime, ids: np.ndarray, scale: float = 1.0) -> torch.Tensor:
    with torch.inference_mode():
        logits = runtime.model(input_ids=torch.as_tensor(ids)).logits.float()
    return torch.log_softmax(logits * scale, dim=-1)[:, :-1]


def test_baseline_against_itself_has_zero_distance(setup) -> None:
    runtime, windows = setup
    reference = ref.compute(runtime, windows, ref.ReferenceShape(8, 2), key="k")
    baseline = baseline_metrics(reference, scored_targets(windows, slice(0, None)))
    metrics = summarize(score(runtime, windows, reference, 2), baseline["ppl"])
    assert metrics["kld_mean"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["top1_agreement_pct"] == 100.0
    assert metrics["ppl_increase_pct"] == pytest.approx(0.0, abs=1e-4)
    assert metrics["tokens"] == 3 * 47


def test_perplexity_matches_transformers_loss(setup) -> None:
    runtime, windows = setup
    reference = ref.compute(runtime, windows, ref.ReferenceShape(8, 2), key="k")
    ids = torch.as_tensor(windows.ids)
    with torch.inference_mode():
        losses = [runtime.model(input_ids=row[None], labels=row[None]).loss.item() for row in ids]
    independent = math.exp(sum(losses) / len(losses))  # equal-length windows: mean of means
    baseline = baseline_metrics(reference, scored_targets(windows, slice(0, None)))
    assert baseline["ppl"] == pytest.approx(independent, rel=1e-5)
    scored = summarize(score(runtime, windows, reference, 3), 1.0)
    assert scored["ppl"] == pytest.approx(independent, rel=1e-5)


def test_compact_kld_is_exact_when_k_covers_the_vocabulary(setup) -> None:
    runtime, windows = setup
    vocab = runtime.vocab_size
    other = _tempered(runtime, 0.7)
    full = ref.compute(runtime, windows, ref.ReferenceShape(vocab, 3), key="full")
    compact = ref.compute(runtime, windows, ref.ReferenceShape(16, 3), key="compact")
    p, q = _log_probs(runtime, windows.ids), _log_probs(runtime, windows.ids, 0.7)
    exact = (p.exp() * (p - q)).sum(-1).mean().item()
    assert score(other, windows, full, 3).kld.mean() == pytest.approx(exact, rel=1e-4)
    approx = score(other, windows, compact, 3).kld.mean()
    assert 0 < approx <= exact * 1.0001  # the top-k + rest estimate is a lower bound


def test_a_distorted_model_scores_worse(setup) -> None:
    runtime, windows = setup
    reference = ref.compute(runtime, windows, ref.ReferenceShape(8, 3), key="k")
    metrics = summarize(score(_tempered(runtime, 4.0), windows, reference, 3), 1.0)
    assert metrics["kld_mean"] > 0.01
    assert metrics["kld_p99"] >= metrics["kld_median"]


def test_a_top_k_only_runtime_scores_like_the_full_distribution(setup) -> None:
    """The same model scored through the endpoint-style contract (own top-k only): identical
    perplexity and top-1; the KLD estimate from the runtime's own top-k stays close to the
    exact top-k + residual estimator."""
    runtime, windows = setup
    reference = ref.compute(runtime, windows, ref.ReferenceShape(16, 3), key="k")
    distorted = _tempered(runtime, 0.8)
    topk_only = TopKOnlyRuntime(runtime.model, runtime.tokenizer)
    topk_only_distorted = _topk_only(_tempered(runtime, 0.8))
    exact, estimated = (
        score(distorted, windows, reference, 3),
        score(topk_only_distorted, windows, reference, 3),
    )
    assert np.array_equal(exact.nll, estimated.nll) and np.array_equal(exact.top1_match, estimated.top1_match)
    assert estimated.kld.mean() == pytest.approx(exact.kld.mean(), rel=0.05)
    assert score(topk_only, windows, reference, 3).kld.mean() == pytest.approx(0.0, abs=1e-5)


def _topk_only(inner: HFRuntime):
    class Wrapped(TopKOnlyRuntime):
        def score(self, request):
            full = inner.score(request)
            return type(full)(full.target_logprobs, full.topk_ids, full.topk_logprobs)

    return Wrapped(inner.model, inner.tokenizer)


def test_reference_cache_roundtrip(setup) -> None:
    runtime, windows = setup
    key = ref.reference_key("fingerprint", windows, 8, "cpu", dtype="float32")
    assert ref.load_cached(key) is None
    reference = ref.compute(runtime, windows, ref.ReferenceShape(8, 2), key=key)
    ref.save(reference)
    cached = ref.load_cached(key)
    assert cached is not None
    assert np.array_equal(cached.topk_ids, reference.topk_ids)
    assert np.allclose(cached.rest_logmass, reference.rest_logmass)
    assert ref.reference_key("fingerprint", windows, 16, "cpu", dtype="float32") != key
    # a reference computed in another precision is another reference
    assert ref.reference_key("fingerprint", windows, 8, "cpu", dtype="bfloat16") != key


def test_sampled_tail_kld_agrees_with_the_full_vocabulary_kld(setup) -> None:
    """Top-k exact plus the sampled tail against KL computed here over the whole vocabulary;
    the top-k + rest bound (no tail sample) reads lower. The tiny model is a hard case: its
    tail holds 93 % of p. Over its 141 positions the estimate at m = 64 spread over
    0.992-1.018x of the exact value for five sample seeds (measured); the seed comes from
    the key, so this test is deterministic. The 2 % agreement on a real model is in
    tests/e2e/test_gguf_smollm2.py."""
    runtime, windows = setup
    sampled = ref.compute(runtime, windows, ref.ReferenceShape(16, 3, tail_samples=64), key="tail")
    bound = ref.compute(runtime, windows, ref.ReferenceShape(16, 3), key="bound")
    p, q = _log_probs(runtime, windows.ids), _log_probs(runtime, windows.ids, 0.7)
    exact = (p.exp() * (p - q)).sum(-1).double().mean().item()
    other = _tempered(runtime, 0.7)
    estimate = score(other, windows, sampled, 3).kld.mean()
    lower = score(other, windows, bound, 3).kld.mean()
    print(f"tiny model, k=16: exact {exact:.5f}, sampled tail {estimate:.5f}, top-k+rest {lower:.5f}")
    assert estimate == pytest.approx(exact, rel=0.03)
    assert lower < 0.6 * exact  # measured 0.47 of the exact value
    assert score(runtime, windows, sampled, 3).kld.mean() == pytest.approx(0.0, abs=1e-6)


def test_tail_samples_come_from_outside_the_top_k_in_proportion_to_p() -> None:
    from quantkit.runtimes.base import sample_tail

    probs = torch.tensor([0.5, 0.23, 0.17, 0.06, 0.04], dtype=torch.float64)
    log_probs = probs.log().float().expand(1, 400, 5).contiguous()
    top = torch.zeros(1, 400, 1, dtype=torch.long)  # id 0 is the top-1
    drawn = sample_tail(log_probs, top, 3, seed=3)
    assert drawn.shape == (1, 400, 3) and not (drawn == 0).any()
    counts = torch.bincount(drawn.flatten(), minlength=5)[1:].double() / drawn.numel()
    assert torch.allclose(counts, probs[1:] / probs[1:].sum(), atol=0.02)
    assert torch.equal(drawn, sample_tail(log_probs, top, 3, seed=3))  # seeded
    assert not torch.equal(drawn, sample_tail(log_probs, top, 3, seed=4))


def test_reference_cache_keeps_the_tail_sample(setup) -> None:
    runtime, windows = setup
    key = ref.reference_key("fingerprint", windows, 8, "cpu", tail_samples=16, dtype="float32")
    assert key != ref.reference_key("fingerprint", windows, 8, "cpu", dtype="float32")
    reference = ref.compute(runtime, windows, ref.ReferenceShape(8, 2, tail_samples=16), key=key)
    ref.save(reference)
    cached = ref.load_cached(key)
    assert cached is not None and cached.tail_samples == 16
    assert np.array_equal(cached.tail_ids, reference.tail_ids)
    assert np.array_equal(cached.tail_logprobs, reference.tail_logprobs)
    # the samples are the baseline's own log-probs of the drawn ids, none of them in its top-k
    p = _log_probs(runtime, windows.ids)
    assert np.allclose(cached.tail_logprobs, p.gather(-1, torch.as_tensor(cached.tail_ids).long()).numpy())
    assert not (cached.tail_ids[..., :, None] == cached.topk_ids[..., None, :]).any()


def test_second_half_scores_what_llama_perplexity_scores(setup) -> None:
    """llama-perplexity scores logits j = n_ctx/2 .. n_ctx-2 of each chunk (token j + 1):
    n_ctx/2 - 1 predictions; the baseline ppl is over exactly those tokens."""
    from quantkit.evals.quality import scored_positions

    runtime, windows = setup
    positions = scored_positions("second_half", 48)
    assert list(range(47))[positions] == list(range(24, 47))
    reference = ref.compute(runtime, windows, ref.ReferenceShape(8, 3), key="half").at(positions)
    p = _log_probs(runtime, windows.ids)
    targets = torch.as_tensor(windows.ids)[:, 1:, None]
    nll = -p.gather(-1, targets).squeeze(-1)[:, 24:]
    baseline = baseline_metrics(reference, scored_targets(windows, positions))
    assert baseline["tokens"] == 3 * 23
    assert baseline["ppl"] == pytest.approx(math.exp(nll.double().mean().item()), rel=1e-5)
    scored = score(
        _tempered(runtime, 0.7), windows, ref.compute(runtime, windows, ref.ReferenceShape(8, 3), key="h"), 3
    )
    assert scored.at(positions).kld.shape == (3, 23)


def test_residual_mass_outside_asked_ids_counts_each_distinct_id_once() -> None:
    from quantkit.runtimes.base import ScoreRequest, scores_from_log_probs

    generator = torch.Generator().manual_seed(0)
    log_probs = torch.log_softmax(3.0 * torch.randn(2, 9, 300, generator=generator), -1)
    ids = torch.randint(0, 300, (2, 9), generator=generator).numpy()
    asked = torch.randint(0, 40, (2, 8, 50), generator=generator)  # many repeats
    asked[0, 0] = torch.arange(300)[torch.randperm(300, generator=generator)[:50]]
    scores = scores_from_log_probs(log_probs, ScoreRequest(ids=ids, top_k=4, reference_ids=asked.numpy()))
    lp = log_probs[:, :-1].double()
    for b in range(2):
        for t in range(8):
            distinct = sorted(set(asked[b, t].tolist()))
            expected = math.log(1.0 - float(lp[b, t, distinct].exp().sum()))
            assert scores.reference_rest_logmass[b, t] == pytest.approx(expected, abs=2e-6)
    assert np.allclose(scores.reference_logprobs, lp.gather(-1, asked).numpy(), atol=1e-6)


def test_scoring_a_chunk_at_a_time_is_bitwise_the_whole_batch(setup, monkeypatch) -> None:
    """Large vocabularies are scored a few positions (and windows per forward pass) at a time,
    so no batch-sized copy of the distribution exists (Gemma 3 on 8 x 512 tokens: peak RSS 10.5
    GB before, 4.3 GB after); the scores, tail samples included, are the same to the bit."""
    from quantkit.runtimes import base, hf
    from quantkit.runtimes.base import ScoreRequest

    runtime, windows = setup
    asked = np.random.default_rng(0).integers(0, runtime.vocab_size, size=(3, 47, 20))
    requests = [
        ScoreRequest(windows.ids, 8, tail_samples=16, seed=3),
        ScoreRequest(windows.ids, 1, reference_ids=asked),
    ]
    whole = [runtime.score(request) for request in requests]
    monkeypatch.setattr(base, "_CHUNK_ELEMENTS", runtime.vocab_size * 5)  # 5 positions per chunk
    monkeypatch.setattr(hf, "_LOGIT_ELEMENTS", 1)  # one window per forward pass
    for before, request in zip(whole, requests, strict=True):
        after = runtime.score(request)
        for field in ("target_logprobs", "topk_ids", "topk_logprobs", "rest_logmass", "reference_logprobs",
                      "reference_rest_logmass", "tail_ids", "tail_logprobs"):  # fmt: skip
            a, b = getattr(before, field), getattr(after, field)
            assert (a is None and b is None) or np.array_equal(a, b), field
