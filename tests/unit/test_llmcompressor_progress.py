"""llm-compressor's per-layer progress comes from forward pre-hooks on the decoder layers: once
per layer, in order, hooks gone afterwards, and no llm-compressor attribute replaced."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from quantkit.backends.base import QuantizeJob
from quantkit.backends.llmcompressor_observer import decoder_layers, layer_progress
from quantkit.backends.llmcompressor_run import oneshot_in_place
from quantkit.inputs.tokens import TokenWindows


class Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(2, 2) for _ in range(3))
        self.head = torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_each_layer_is_reported_once_and_the_hooks_are_removed() -> None:
    model = Stack()
    assert list(decoder_layers(model)) == [0, 1, 2]  # not the head, not the ModuleList
    seen: list[int] = []
    with layer_progress(model, seen.append):
        model(torch.ones(1, 2))
        model(torch.ones(1, 2))  # a second pass (propagation, AWQ's search) reports nothing new
    assert seen == [0, 1, 2]
    assert not any(layer._forward_pre_hooks for layer in model.layers)


def test_a_tiny_gptq_run_reports_every_decoder_layer_without_patching(tiny_model: Path) -> None:
    from llmcompressor.core import LifecycleCallbacks
    from llmcompressor.modifiers.quantization import GPTQModifier
    from transformers import AutoModelForCausalLM

    original = LifecycleCallbacks.__dict__["sequential_epoch_end"]
    seen: list[int] = []

    def on_layer(index: int) -> None:
        assert LifecycleCallbacks.__dict__["sequential_epoch_end"] is original  # not patched
        seen.append(index)

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, model.config.vocab_size, size=(4, 32), dtype=np.int64)
    job = QuantizeJob(model_path=tiny_model, out_dir=tiny_model, device="cpu", seed=0, on_layer=on_layer)
    recipe = GPTQModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"])
    _, errors = oneshot_in_place(job, model, recipe, TokenWindows(ids=ids, seq_len=32, hash="x"))
    assert seen == list(range(model.config.num_hidden_layers))
    assert LifecycleCallbacks.__dict__["sequential_epoch_end"] is original
    assert not any(layer._forward_pre_hooks for layer in decoder_layers(model).values())
    assert len(errors) == 7 * model.config.num_hidden_layers  # losses still recorded
