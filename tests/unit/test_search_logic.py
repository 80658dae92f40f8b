"""The search's arithmetic on a synthetic profile: rank correlation, the demotion path (greedy,
seeded, exact sizes), the measured-profile calibration and the recipe a mix becomes."""

from __future__ import annotations

import pytest

from quantkit.search.driver import _next_index
from quantkit.search.mix import build_path, calibrated, mix_options
from quantkit.search.profile import BITS, PROXY_TYPES, Profile, TensorScore, UnitScore, spearman

ERROR_BY_TYPE = {"Q8_0": 0.0, "Q5_1": 1.0, "Q5_0": 1.5, "Q4_1": 3.0, "Q4_0": 4.0}


def profile(measured: dict[str, float] | None = None) -> Profile:
    """Two layers x two classes of 100 weights, plus a 50-weight embedding; layer 1 is 10x as
    sensitive as layer 0 by the proxy."""
    tensors = [
        TensorScore(
            name=f"blk.{layer}.{kind}.weight",
            layer=layer,
            kind=kind,
            params=100,
            width=64,
            proxy={t: e * (10 if layer else 1) for t, e in ERROR_BY_TYPE.items()},
        )
        for layer in (0, 1)
        for kind in ("attn_q", "ffn_down")
    ]
    tensors.append(
        TensorScore(name="token_embd.weight", layer=None, kind="token_embd.weight", params=50, width=64,
                    proxy={t: e * 100 for t, e in ERROR_BY_TYPE.items()})
    )  # fmt: skip
    units = [
        UnitScore(
            unit=name, kind=kind, tensors=1, params=1, proxy=1.0, kld_increase=(measured or {}).get(name)
        )
        for name, kind in (
            ("layer 0", "layer"),
            ("layer 1", "layer"),
            ("attn_q", "class"),
            ("ffn_down", "class"),
        )
    ]
    return Profile(model="m", base="Q8_0", low="Q4_0", eval={}, units=units, tensors=tensors,
                   other_params=10, other_bits=320.0)  # fmt: skip


def test_spearman_is_one_for_the_same_order_and_minus_one_reversed() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 400]) == 1.0
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert spearman([1, 2], [1, 2]) is None  # too few points
    assert spearman([1, 1, 1], [1, 2, 3]) is None  # no order on one side


def test_the_path_demotes_the_least_sensitive_first_and_counts_bits_exactly() -> None:
    prof = profile()
    path = build_path(prof, calibrated(prof), seed=0)
    total = 4 * 100 + 50 + 10
    assert path.bpw(0) == pytest.approx((450 * BITS["Q8_0"] + 320) / total)
    assert path.bpw(len(path.steps)) == pytest.approx((450 * BITS["Q4_0"] + 320) / total)
    first_layer1 = next(i for i, s in enumerate(path.steps) if s.tensor.startswith("blk.1."))
    assert all(s.tensor.startswith("blk.0.") for s in path.steps[:first_layer1])  # layer 0 goes first
    assert path.steps[-1].tensor == "token_embd.weight"  # the most sensitive per bit, last
    assert [s.predicted for s in path.steps] == sorted(s.predicted for s in path.steps)
    assert all(PROXY_TYPES.index(s.after) > PROXY_TYPES.index(s.before) for s in path.steps)


def test_the_path_is_a_function_of_the_seed() -> None:
    prof = profile()
    errors = calibrated(prof)
    again = [s.tensor for s in build_path(prof, errors, seed=3).steps]
    assert [s.tensor for s in build_path(prof, errors, seed=3).steps] == again
    # attn_q and ffn_down of a layer tie: the seed orders them
    orders = {tuple(s.tensor for s in build_path(prof, errors, seed=seed).steps[:2]) for seed in range(8)}
    assert len(orders) == 2


def test_a_measured_profile_rescales_the_proxy_to_its_units() -> None:
    """Measured: layer 0 is the sensitive one (the proxy said layer 1)."""
    prof = profile({"layer 0": 0.04, "layer 1": 0.004, "attn_q": 0.022, "ffn_down": 0.022})
    errors = calibrated(prof)
    layer = {i: sum(errors[f"blk.{i}.{k}.weight"]["Q4_0"] for k in ("attn_q", "ffn_down")) for i in (0, 1)}
    assert layer[0] == pytest.approx(0.04, rel=0.05) and layer[1] == pytest.approx(0.004, rel=0.05)
    path = build_path(prof, errors, seed=0)
    first_layer0 = next(i for i, s in enumerate(path.steps) if s.tensor.startswith("blk.0."))
    assert all(s.tensor.startswith(("blk.1.", "token_embd")) for s in path.steps[:first_layer0])


def test_a_mix_becomes_options_with_one_pattern_per_class_and_type() -> None:
    mix = {f"blk.{i}.attn_q.weight": "Q4_0" for i in range(3)} | {
        "blk.0.ffn_down.weight": "Q5_0",
        "blk.1.ffn_down.weight": "Q8_0",
        "blk.2.ffn_down.weight": "Q5_0",
        "token_embd.weight": "Q5_1",
    }
    assert mix_options(mix, "Q8_0") == {
        "type": "Q8_0",
        "outtype": "f16",
        "imatrix": False,
        "token_embedding_type": "Q5_1",
        "tensor_types": {r"^blk\.\d+\.attn_q\.weight$": "Q4_0", r"^blk\.(0|2)\.ffn_down\.weight$": "Q5_0"},
    }


def test_the_next_candidate_stays_inside_the_bracket() -> None:
    prof = profile()
    path = build_path(prof, calibrated(prof), seed=0)
    last = len(path.steps)
    first = _next_index(path, 1.0, (0, last + 1), None)
    assert first is not None and 0 < first <= last
    assert abs(path.bpw(first) - (path.bpw(0) + path.bpw(last)) / 2) < 1.0  # about half the bits
    assert _next_index(path, 1.0, (3, 4), 1.0) is None  # adjacent: the frontier
    nxt = _next_index(path, 1e9, (2, 7), 1.0)  # everything predicted to pass: the furthest inside
    assert nxt == 6
    low = _next_index(path, 0.0, (2, 7), 1.0)  # nothing predicted to pass: bisect
    assert low is not None and 2 < low < 7


def _record_with(tmp_path, objective: str):
    """Three candidates: A met the budget at 5.0 bpw, 40 tok/s, 300 MB; B met it at 5.5 bpw, 55
    tok/s, 320 MB; C did not (the smallest, fastest, leanest)."""
    from quantkit.search.driver import SearchRequest
    from quantkit.search.record import Budget, Candidate, FormatPath, SearchRecord

    rows = {"A": (5.0, 40.0, 300e6, 0.04), "B": (5.5, 55.0, 320e6, 0.03), "C": (4.6, 70.0, 250e6, 0.2)}
    candidates = []
    for name, (bpw, decode, memory, kld) in rows.items():
        recipe = tmp_path / f"{name}.yaml"
        recipe.write_text(f"name: {name}\n")
        candidates.append(
            Candidate(name=name, index=1, predicted_bpw=bpw, predicted_kld_increase=0.0, run_id=name,
                      recipe=str(recipe), value=kld, kld=kld, bpw=bpw, decode_tok_s=decode,
                      peak_memory_bytes=memory, passed=kld <= 0.05)
        )  # fmt: skip
    budget = Budget(metric="kld_mean", limit=0.05)
    record = SearchRecord(
        model="m", budget=budget, objective=objective, seed=0, max_candidates=3, formats=["gguf"],
        paths=[FormatPath(format="gguf", profile="proxy", steps=3, bpw=[8.5, 4.5])], candidates=candidates,
    )  # fmt: skip
    request = SearchRequest(recipe=None, budget=budget, out=tmp_path, objective=objective)  # type: ignore[arg-type]
    return request, record


@pytest.mark.parametrize(
    ("objective", "winner", "said"),
    [
        ("size", "A", "at 5.0 bpw: the fewest bits per weight of the 2 candidate(s)"),
        ("decode", "B", "at 55.0 tokens/s decode, 5.5 bpw: the fastest measured decode"),
        ("memory", "A", "at 300.0 MB peak, 5.0 bpw: the least measured peak memory"),
    ],
)
def test_the_winner_is_the_best_at_the_objective_among_those_that_met_the_budget(
    tmp_path, objective: str, winner: str, said: str
) -> None:
    """C is smaller, faster and leaner but missed the budget: never chosen."""
    from quantkit.search.driver import _choose

    request, record = _record_with(tmp_path, objective)
    assert _choose(request, record) == 0
    assert record.chosen == winner and said in record.why, record.why
    assert (tmp_path / "chosen-recipe.yaml").read_text() == f"name: {winner}\n"


def test_a_decode_search_without_measured_speeds_chooses_none(tmp_path) -> None:
    from quantkit.search.driver import _choose

    request, record = _record_with(tmp_path, "decode")
    for candidate in record.candidates:
        candidate.decode_tok_s = None
    assert _choose(request, record) == 1 and record.chosen is None
