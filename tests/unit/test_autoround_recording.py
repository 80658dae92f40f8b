"""The AutoRound driver's per-block record: progress and losses from AutoRound's SignRound
quantizer's own methods, called as AutoRound's composer calls them (block context positional)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import require_extra

require_extra("auto_round", "autoround")


def test_blocks_losses_and_steps_are_recorded_as_the_composer_calls_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch
    from auto_round.algorithms.quantization.sign_round.quantizer import SignRoundQuantizer

    from quantkit.backends.autoround_run import BlockRecorder, _recording
    from quantkit.backends.base import QuantizeJob

    losses = {0: [[4.0, 2.0], [3.0, 1.0], [5.0, 5.0]], 1: [[1.0], [2.0]]}  # per block: steps of batches

    def quantize_block(self, block, fp_inputs, input_others, fp_outputs, q_inputs, block_ctx, input_ids=None):
        for step, batches in enumerate(losses[block_ctx.block_index]):
            for value in batches:
                self._get_loss(torch.tensor(value))
            if step < len(losses[block_ctx.block_index]) - 1:  # the last step may stop before _step
                self._step(None, None, None)
        return {}

    monkeypatch.setattr(SignRoundQuantizer, "quantize_block", quantize_block)
    monkeypatch.setattr(SignRoundQuantizer, "_get_loss", lambda self, loss, *args, **kwargs: loss)
    monkeypatch.setattr(SignRoundQuantizer, "_step", lambda self, *args: None)
    started: list[int] = []
    job = QuantizeJob(model_path=None, out_dir=None, device="cpu", seed=0, on_layer=started.append)  # type: ignore[arg-type]
    recorder = BlockRecorder(job, ["model.layers.0", "model.layers.1"])
    quantizer = object.__new__(SignRoundQuantizer)
    with _recording(recorder):
        for index in (0, 1):  # the composer passes the block context positionally
            SignRoundQuantizer.quantize_block(
                quantizer, "block", [], {}, [], None, SimpleNamespace(block_index=index)
            )
    assert SignRoundQuantizer.quantize_block is quantize_block  # restored
    assert started == [0, 1]
    assert recorder.rows == [
        {"module": "model.layers.0", "method": "AutoRound", "initial_loss": 3.0, "best_loss": 2.0,
         "best_iter": 1, "iters": 3},
        {"module": "model.layers.1", "method": "AutoRound", "initial_loss": 1.0, "best_loss": 1.0,
         "best_iter": 0, "iters": 2},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("iters", "bits", "lr"),
    [
        (0, 4, None),
        (4, 4, None),
        (200, 4, None),
        (1000, 3, None),
        (1000, 4, None),
        (1000, None, None),
        (8, 4, 0.01),
    ],
)
def test_the_recorded_learning_rate_is_the_one_autoround_resolves(
    iters: int, bits: int | None, lr: float | None
) -> None:
    """The manifest's ``lr`` is AutoRound's own choice (SignRoundConfig's rule), not a copy
    that drifts from it: a changed rule in a new AutoRound fails here."""
    from auto_round.algorithms.quantization.sign_round.config import SignRoundConfig

    from quantkit.backends.autoround_run import _rate

    config = SignRoundConfig(iters=iters, lr=lr)
    expected = lr if lr is not None else config._lr_for_bits(bits)
    assert _rate({"iters": iters, "bits": bits, "lr": lr}) == (iters, expected)
    if iters == 4 and lr is None:
        assert expected == 0.25


def test_a_note_warns_of_the_default_lr_at_few_steps_only() -> None:
    from quantkit.backends.autoround_run import few_iters_note

    note = few_iters_note({"iters": 8, "lr": None, "bits": 4})
    assert note is not None and "lr = 1/iters = 0.125" in note and "set options.lr" in note
    assert few_iters_note({"iters": 8, "lr": 0.01, "bits": 4}) is None  # the user chose
    assert few_iters_note({"iters": 50, "lr": None, "bits": 4}) is None  # AutoRound's light preset
    assert few_iters_note({"iters": 0, "lr": None, "bits": 4}) is None  # RTN mode: no tuning
