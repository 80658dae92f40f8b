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
