"""The importance matrix: llama-imatrix's statistics, without the vocabulary-wide logits a tied
output head does not need."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from quantkit.backends import imatrix
from quantkit.inputs.tokens import TokenWindows
from quantkit.util.testing import make_tiny_llama

VOCAB = 384


def _tensors(tied: bool) -> dict[str, int]:
    widths = {"attn_q": 128, "attn_k": 128, "attn_v": 128, "attn_output": 128}
    widths |= {"ffn_gate": 128, "ffn_up": 128, "ffn_down": 256}
    tensors = {f"blk.{layer}.{name}.weight": width for layer in range(2) for name, width in widths.items()}
    return tensors if tied else tensors | {"output.weight": 128}


def _head_positions(model_dir: Path, windows: TokenWindows, tensors: dict[str, int]) -> tuple[list, dict]:
    """The positions per forward pass whose logits the output head computed, and the matrix."""
    seen: list[int] = []

    def record(module: torch.nn.Module, _inputs: object, output: object) -> None:
        if isinstance(module, torch.nn.Linear) and module.out_features == VOCAB:
            assert isinstance(output, torch.Tensor)
            seen.append(output.shape[-2])

    handle = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        matrix = imatrix.compute(model_dir, windows, "llama", tensors, "cpu")
    finally:
        handle.remove()
    return seen, matrix.sums


def _tiny_llama(out: Path, tied: bool) -> Path:
    make_tiny_llama(out)
    if not tied:  # the output head as a tensor of its own
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(out)
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone() * 0.5)
        model.save_pretrained(out)
    return out


@pytest.mark.parametrize("tied", [True, False])
def test_the_head_computes_every_position_only_when_it_is_a_tensor_of_its_own(
    tmp_path: Path, tied: bool
) -> None:
    model_dir = _tiny_llama(tmp_path / "m", tied)
    ids = np.random.default_rng(0).integers(1, VOCAB, size=(3, 64))
    windows = TokenWindows(ids=ids, seq_len=64, hash="x")
    seen, sums = _head_positions(model_dir, windows, _tensors(tied))
    assert seen == ([1, 1, 1] if tied else [64, 64, 64])  # a tied head: the last position only
    assert set(sums) == set(_tensors(tied))

    # the decoder's statistics are those of a plain full forward pass over each window
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    captured: list[torch.Tensor] = []
    hook = model.model.layers[1].mlp.down_proj.register_forward_pre_hook(
        lambda _m, inputs: captured.append(inputs[0].reshape(-1, 256).float())
    )
    with torch.inference_mode():
        for row in ids:
            model(input_ids=torch.as_tensor(row)[None])
    hook.remove()
    expected = sum((x * x).sum(0) for x in captured)
    assert isinstance(expected, torch.Tensor)
    np.testing.assert_allclose(sums["blk.1.ffn_down.weight"], expected.numpy(), rtol=1e-5)


def test_the_residual_stream_norms_leave_each_windows_first_position_out(tmp_path: Path) -> None:
    """E||h||^2 entering each decoder layer and leaving the last, over every position but each
    window's first: what the search's proxy divides each tensor's error by."""
    from transformers import AutoModelForCausalLM

    model_dir = _tiny_llama(tmp_path / "m", tied=True)
    ids = np.random.default_rng(1).integers(1, VOCAB, size=(3, 64))
    windows = TokenWindows(ids=ids, seq_len=64, hash="x")
    matrix = imatrix.compute(model_dir, windows, "llama", _tensors(True), "cpu")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model(input_ids=torch.as_tensor(ids), output_hidden_states=True)
    # hidden_states: the embeddings (entering layer 0), layer 0's output (entering layer 1), and
    # the last layer's output after the final norm: recompute that one before the norm
    entering = [h[:, 1:].pow(2).sum(-1).mean().item() for h in out.hidden_states[:-1]]
    captured: list[torch.Tensor] = []
    hook = model.model.norm.register_forward_pre_hook(lambda _m, inputs: captured.append(inputs[0]))
    with torch.inference_mode():
        model(input_ids=torch.as_tensor(ids))
    hook.remove()
    leaving = captured[0][:, 1:].pow(2).sum(-1).mean().item()
    assert len(matrix.residual) == 3
    np.testing.assert_allclose(matrix.residual, [*entering, leaving], rtol=1e-5)
