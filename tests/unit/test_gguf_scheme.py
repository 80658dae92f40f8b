"""A GGUF's scheme label says what the file holds (issue #39): the header's file type when the
quantized tensors have its preset's types, "mixed" with each type's share when they do not."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from quantkit.llamacpp.gguf_scheme import gguf_scheme
from quantkit.llamacpp.gguf_types import BLOCKS, GGUFTensor, ModelShape, tensor_types

HIDDEN, FFN, VOCAB, LAYERS = 256, 512, 320, 2
_SHAPES = {  # ne (row length first), as llama.cpp lists a llama's tensors
    "token_embd.weight": (HIDDEN, VOCAB),
    "output_norm.weight": (HIDDEN,),
    **{
        f"blk.{i}.{name}": shape
        for i in range(LAYERS)
        for name, shape in (
            ("attn_norm.weight", (HIDDEN,)),
            ("attn_q.weight", (HIDDEN, HIDDEN)),
            ("attn_k.weight", (HIDDEN, HIDDEN)),
            ("attn_v.weight", (HIDDEN, HIDDEN)),
            ("attn_output.weight", (HIDDEN, HIDDEN)),
            ("ffn_norm.weight", (HIDDEN,)),
            ("ffn_gate.weight", (HIDDEN, FFN)),
            ("ffn_up.weight", (HIDDEN, FFN)),
            ("ffn_down.weight", (FFN, HIDDEN)),
        )
    },
}
TENSORS = [GGUFTensor(name, shape) for name, shape in _SHAPES.items()]


def _write(path: Path, file_type: str, types: dict[str, str]) -> Path:
    """A GGUF header (and data of the right size) holding ``types``; the bytes are zeros: the
    label is read from the header alone."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(LAYERS)
    writer.add_head_count(4)
    writer.add_head_count_kv(4)
    writer.add_file_type(gguf.LlamaFileType[f"MOSTLY_{file_type}"].value)
    for tensor in TENSORS:
        kind = types[tensor.name]
        block, size = BLOCKS[kind]
        rows = tensor.elements // tensor.ne[0]
        dtype = {"F32": np.float32, "F16": np.float16}.get(kind, np.uint8)
        width = tensor.ne[0] if kind in ("F32", "F16") else tensor.ne[0] // block * size
        data = np.zeros((rows, width) if len(tensor.ne) > 1 else (width,), dtype=dtype)
        writer.add_tensor(tensor.name, data, raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _preset(file_type: str) -> dict[str, str]:
    return tensor_types(TENSORS, file_type, ModelShape(n_layer=LAYERS, n_gqa=1), imatrix=False)


def test_a_presets_file_is_named_by_its_file_type(tmp_path: Path) -> None:
    for file_type in ("Q8_0", "Q4_K_M"):
        scheme = gguf_scheme(_write(tmp_path / f"{file_type}.gguf", file_type, _preset(file_type)))
        assert (scheme.label, scheme.mixed, scheme.file_type) == (file_type, False, file_type)
        assert abs(sum(scheme.shares.values()) - 100) < 0.2


def test_a_file_whose_types_differ_from_its_preset_is_mixed_with_each_share(tmp_path: Path) -> None:
    """The header still says Q8_0, as llama-quantize writes it for a --tensor-type mix."""
    types = _preset("Q8_0") | {
        f"blk.{i}.{name}.weight": "Q4_0" for i in range(LAYERS) for name in ("ffn_gate", "ffn_up", "ffn_down")
    }
    scheme = gguf_scheme(_write(tmp_path / "mix.gguf", "Q8_0", types))
    # quantized weights: 2 x (4 x 256^2 + 3 x 256 x 512) + 256 x 320 = 1,392,640; Q4_0 holds 786,432
    assert scheme.mixed and scheme.file_type == "Q8_0"
    assert scheme.shares == {"Q4_0": 56.5, "Q8_0": 43.5}
    assert scheme.label == "mixed Q4_0 56% Q8_0 44%"
    one_layer = _preset("Q8_0") | {"blk.1.attn_v.weight": "Q4_0"}  # one tensor is enough
    assert gguf_scheme(_write(tmp_path / "one.gguf", "Q8_0", one_layer)).label == "mixed Q8_0 95% Q4_0 5%"
