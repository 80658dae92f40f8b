"""Importance matrix for llama.cpp quantization, from the shared calibration tokens.

For every linear layer, the per-input-column sum of squared activations over the calibration
tokens (what llama.cpp's ``llama-imatrix`` collects), keyed by the GGUF tensor name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantkit.errors import BackendError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import torch
    from torch.utils.hooks import RemovableHandle
    from transformers import PreTrainedModel

    from quantkit.inputs.calibration import TokenWindows


@dataclass
class ImportanceMatrix:
    """``sums[name]``: Σ x² per input column; ``counts[name]``: tokens seen; ``residual[i]``:
    the mean squared norm of the residual stream entering decoder layer ``i`` (the last entry:
    leaving the last layer), each window's first position left out (an attention sink's
    activations are orders of magnitude larger than the rest's)."""

    sums: dict[str, npt.NDArray[np.float32]]
    counts: dict[str, int]
    chunk_size: int
    chunks: int
    residual: list[float] = field(default_factory=list)

    def means(self) -> dict[str, npt.NDArray[np.float32]]:
        return {name: (values / self.counts[name]).astype("float32") for name, values in self.sums.items()}


def compute(
    model_path: Path, windows: TokenWindows, gguf_arch: str, gguf_tensors: dict[str, int], device: str
) -> ImportanceMatrix:
    """Run the HF model over ``windows`` and collect activation statistics per GGUF tensor."""
    import gguf
    import torch
    from transformers import AutoModelForCausalLM

    from quantkit.device import compute_dtype

    arch = {name: key for key, name in gguf.MODEL_ARCH_NAMES.items()}.get(gguf_arch)
    if arch is None:
        raise BackendError(f"the gguf package does not know architecture '{gguf_arch}'", "upgrade gguf")
    model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=compute_dtype(device))
    model = model.to(device).eval()
    name_map = gguf.get_tensor_name_map(arch, model.config.num_hidden_layers)
    names: dict[torch.nn.Linear, str] = {}
    for module_name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        mapped = name_map.get_name(module_name)
        tensor = f"{mapped}.weight" if mapped else None
        if tensor is not None and gguf_tensors.get(tensor) == module.in_features:
            names[module] = tensor
    if not names:
        raise BackendError("no linear layer matched a GGUF tensor for the importance matrix", "report this")
    return collect(model, windows, names, device)


def collect(
    model: PreTrainedModel, windows: TokenWindows, names: Mapping[torch.nn.Linear, str], device: str
) -> ImportanceMatrix:
    """Run ``model`` over ``windows``: Σ x² per input column of every linear module in ``names``
    (keyed by its name there) and the residual stream's mean squared norm per decoder layer."""
    import numpy as np
    import torch

    sums: dict[str, Any] = {}
    counts: dict[str, int] = {}
    hooks: list[RemovableHandle] = []
    for module, tensor in names.items():

        def hook(_module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], tensor: str = tensor) -> None:
            x = inputs[0].detach().float().reshape(-1, inputs[0].shape[-1])
            squares = (x * x).sum(0)
            sums[tensor] = squares if tensor not in sums else sums[tensor] + squares
            counts[tensor] = counts.get(tensor, 0) + x.shape[0]

        hooks.append(module.register_forward_pre_hook(hook))
    residual, seen = _residual_norm_hooks(model, hooks)
    # The output head is hooked only when it is a tensor of its own (untied): otherwise its
    # logits are not needed, and over a large vocabulary (Gemma's 262k) they would be the
    # largest allocation and the largest matmul of the pass. Keep the last position's only.
    keep = {} if model.get_output_embeddings() in names else {"logits_to_keep": 1}
    try:
        with torch.inference_mode():
            for row in windows.ids:
                ids = torch.as_tensor(row, dtype=torch.long)[None].to(device)
                model(input_ids=ids, use_cache=False, **keep)
    finally:
        for handle in hooks:
            handle.remove()
    return ImportanceMatrix(
        sums={name: value.cpu().numpy().astype(np.float32) for name, value in sums.items()},
        counts=counts,
        chunk_size=windows.seq_len,
        chunks=len(windows.ids),
        residual=[total / count if count else 0.0 for total, count in zip(residual, seen, strict=True)],
    )


def _residual_norm_hooks(
    model: PreTrainedModel, hooks: list[RemovableHandle]
) -> tuple[list[float], list[int]]:
    """Hooks (added to ``hooks``) summing the residual stream's squared norm (positions after
    the first) entering each decoder layer and leaving the last; the sums and counts they fill."""
    import torch

    layers = [m for name, m in model.named_modules() if re.fullmatch(r"(.+\.)?layers\.\d+", name)]
    residual = [0.0] * (len(layers) + 1)
    seen = [0] * (len(layers) + 1)

    def norms(index: int, hidden: object) -> None:
        if isinstance(hidden, torch.Tensor) and hidden.dim() == 3 and hidden.shape[1] > 1:
            squares = hidden[:, 1:].detach().float().pow(2).sum(-1)
            residual[index] += float(squares.sum())
            seen[index] += squares.numel()

    for index, layer in enumerate(layers):
        hooks.append(
            layer.register_forward_pre_hook(
                lambda _m, args, kwargs, i=index: norms(
                    i, kwargs.get("hidden_states", args[0] if args else None)
                ),
                with_kwargs=True,
            )
        )
    if layers:
        hooks.append(
            layers[-1].register_forward_hook(
                lambda _m, _args, output: norms(
                    len(layers), output[0] if isinstance(output, tuple) else output
                )
            )
        )
    return residual, seen


def save(matrix: ImportanceMatrix, path: Path, dataset: str) -> None:
    """Write the matrix in llama.cpp's GGUF imatrix format (``llama-quantize --imatrix``)."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch="imatrix")
    writer.add_string("general.type", "imatrix")
    writer.add_array("imatrix.datasets", [dataset])
    writer.add_uint32("imatrix.chunk_count", matrix.chunks)
    writer.add_uint32("imatrix.chunk_size", matrix.chunk_size)
    for name in sorted(matrix.sums):
        writer.add_tensor(f"{name}.in_sum2", matrix.sums[name].reshape(1, -1))
        writer.add_tensor(f"{name}.counts", np.array([[matrix.counts[name]]], dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
