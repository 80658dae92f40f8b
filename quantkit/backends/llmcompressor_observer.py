"""Per-layer progress of llm-compressor's ``oneshot`` without patching llm-compressor.

A forward pre-hook (PyTorch's public hook API) on each decoder layer reports the layer's index
when llm-compressor's sequential pipeline first runs it: the pipeline calls each decoder layer
as a module of its traced subgraph, layer after layer (llmcompressor/pipelines/sequential/
pipeline.py), so ``on_layer(i)`` means "layer i started, the ones before it are done"; the
layer's later runs (the pipeline's propagation pass, AWQ's scale search) are not reported again.
Nothing enters the recipe, so the checkpoint (``recipe.yaml`` included) is unchanged. A
data-free recipe (RTN, FP8) runs no layer, so it reports none.

Why not a modifier observing the lifecycle events: llm-compressor 0.14 runs ``oneshot`` through
its ``independent`` pipeline by default (``DatasetArguments.pipeline``, args/dataset_arguments.py),
which sets the session's recipe to one modifier at a time while that modifier's own pipeline
runs (pipelines/independent/pipeline.py): a modifier added to the recipe receives only the
events of its own data-free pass, never GPTQ's or AWQ's ``SEQUENTIAL_EPOCH_END``. Passing
``pipeline="sequential"`` would deliver them, at the price of overriding llm-compressor's
pipeline choice (AWQ's follow-on ``QuantizationModifier`` would calibrate inside the sequential
pass) and of taking the observer out of the session's recipe before saving, since
``save_pretrained`` writes that recipe to ``recipe.yaml``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_DECODER_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)$")


def decoder_layers(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """The model's decoder layers (modules named ``….layers.<index>``) by index."""
    found = ((_DECODER_LAYER.search(name), module) for name, module in model.named_modules())
    return {int(match.group(1)): module for match, module in found if match}


@contextmanager
def layer_progress(model: torch.nn.Module, on_layer: Callable[[int], None]) -> Iterator[None]:
    """Call ``on_layer(index)`` the first time decoder layer ``index`` of ``model`` runs, for
    the duration; the hooks are removed on leaving."""
    reported: set[int] = set()

    def reporter(index: int) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: object) -> None:
            if index not in reported:
                reported.add(index)
                on_layer(index)

        return hook

    with ExitStack() as hooks:
        for index, layer in decoder_layers(model).items():
            hooks.callback(layer.register_forward_pre_hook(reporter(index)).remove)
        yield
