"""The ggml type llama-quantize gives each tensor of a model, without quantizing anything.

A port of llama.cpp's ``llama_tensor_get_type`` (src/llama-quant.cpp) for dense decoder models
(no MoE experts, no Falcon): which tensors are quantized at all, the k-quant mixes (``_M``
types give ``attn_v`` and ``ffn_down`` more bits in the first and last eighth of the layers
and every third one between), the output tensor's type (the token embedding's when the two
are tied), and the fallback when a row is not a multiple of the type's block (Gemma 3 270M's
640-wide rows: Q4_K -> Q5_0, Q6_K -> Q8_0). ``quantkit plan`` sums the bytes from it; the
e2e tests compare it tensor by tensor with files llama.cpp wrote.

Per-tensor overrides (llama-quantize's ``--tensor-type``, ``--output-tensor-type`` and
``--token-embedding-type``; ``Overrides``) follow ``llama_tensor_get_type``'s precedence: the
token-embedding type, then the output type, then the first pattern that ``regex_search``es the
tensor's name; a tensor a pattern took skips the mix rules, so it does not advance their
per-kind counters (overriding ``blk.0.ffn_down`` shifts which later ``ffn_down`` get more bits).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# (block size, bytes per block) of ggml's types (ggml.c's type traits)
BLOCKS: dict[str, tuple[int, int]] = {
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "Q4_0": (32, 18), "Q4_1": (32, 20),
    "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34), "Q2_K": (256, 84), "Q3_K": (256, 110),
    "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210), "IQ2_XXS": (256, 66),
    "IQ2_XS": (256, 74), "IQ2_S": (256, 82), "IQ3_XXS": (256, 98), "IQ3_S": (256, 110),
    "IQ1_S": (256, 50), "IQ1_M": (256, 56), "IQ4_NL": (32, 18), "IQ4_XS": (256, 136),
}  # fmt: skip

# llama-quantize's file type -> the default type of its tensors
DEFAULT_TYPE: dict[str, str] = {
    "F32": "F32", "F16": "F16", "BF16": "BF16", "Q8_0": "Q8_0", "Q4_0": "Q4_0", "Q5_0": "Q5_0",
    "Q6_K": "Q6_K", "Q5_K_M": "Q5_K", "Q5_K_S": "Q5_K", "Q4_K_M": "Q4_K", "Q4_K_S": "Q4_K",
    "IQ4_XS": "IQ4_XS", "IQ4_NL": "IQ4_NL", "Q3_K_L": "Q3_K", "Q3_K_M": "Q3_K", "Q3_K_S": "Q3_K",
    "IQ3_M": "IQ3_S", "IQ3_S": "IQ3_S", "IQ3_XS": "IQ3_S", "IQ3_XXS": "IQ3_XXS", "Q2_K": "Q2_K",
    "Q2_K_S": "Q2_K", "IQ2_M": "IQ2_S", "IQ2_S": "IQ2_XS", "IQ2_XS": "IQ2_XS",
    "IQ2_XXS": "IQ2_XXS", "IQ1_M": "IQ1_M", "IQ1_S": "IQ1_S",
}  # fmt: skip

# llama.cpp's tensor_type_fallback for rows that are not a multiple of the block (0.3.36's
# llama.cpp: Q2_K and Q3_K fall back to Q4_0, the i-quants to IQ4_NL)
FALLBACK = {
    "IQ2_XXS": "IQ4_NL", "IQ2_XS": "IQ4_NL", "IQ2_S": "IQ4_NL", "IQ3_XXS": "IQ4_NL",
    "IQ3_S": "IQ4_NL", "IQ1_S": "IQ4_NL", "IQ1_M": "IQ4_NL", "Q2_K": "Q4_0", "Q3_K": "Q4_0",
    "IQ4_XS": "IQ4_NL", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0",
}  # fmt: skip
# ggml types a tensor can be given (llama-quantize's --tensor-type names, upper-cased)
TENSOR_TYPES = tuple(BLOCKS)
# llama.cpp refuses these without an importance matrix, except for token_embd and output
TENSOR_NEEDS_IMATRIX = frozenset({"IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_M", "IQ1_S"})
_UNQUANTIZED = ("F32", "F16", "BF16")
_TOKEN_EMBD = ("token_embd.weight", "per_layer_token_embd.weight")
_ATTN_OUTPUT = {"Q2_K": "Q3_K", "IQ3_XXS": "IQ3_S", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K", "IQ3_M": "Q4_K"}
_LOW_IQ = {"IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"}

# Hugging Face module names -> llama.cpp's (convert_hf_to_gguf's tensor map, dense decoders)
_HF_TO_GGUF = [
    (r"(?:model\.)?embed_tokens\.weight$", "token_embd.weight"),
    (r"lm_head\.weight$", "output.weight"),
    (r"(?:^|\.)norm\.weight$", "output_norm.weight"),  # not input_layernorm.weight
    (r"layers\.(\d+)\.self_attn\.q_proj\.weight$", r"blk.\1.attn_q.weight"),
    (r"layers\.(\d+)\.self_attn\.k_proj\.weight$", r"blk.\1.attn_k.weight"),
    (r"layers\.(\d+)\.self_attn\.v_proj\.weight$", r"blk.\1.attn_v.weight"),
    (r"layers\.(\d+)\.self_attn\.qkv_proj\.weight$", r"blk.\1.attn_qkv.weight"),
    (r"layers\.(\d+)\.self_attn\.o_proj\.weight$", r"blk.\1.attn_output.weight"),
    (r"layers\.(\d+)\.mlp\.gate_proj\.weight$", r"blk.\1.ffn_gate.weight"),
    (r"layers\.(\d+)\.mlp\.up_proj\.weight$", r"blk.\1.ffn_up.weight"),
    (r"layers\.(\d+)\.mlp\.down_proj\.weight$", r"blk.\1.ffn_down.weight"),
    (r"layers\.(\d+)\.input_layernorm\.weight$", r"blk.\1.attn_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.q_norm\.weight$", r"blk.\1.attn_q_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.k_norm\.weight$", r"blk.\1.attn_k_norm.weight"),
    (r"layers\.(\d+)\.(\w+)\.weight$", r"blk.\1.\2.weight"),  # other norms and the like: 1-D, kept
]


def gguf_name(hf_name: str) -> str:
    """llama.cpp's name of an HF tensor (unknown ones keep their own)."""
    for pattern, replacement in _HF_TO_GGUF:
        found = re.search(pattern, hf_name)
        if found:
            return found.expand(replacement)
    return hf_name


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor as llama.cpp sees it: its name and ``ne`` (``ne[0]`` is the row length)."""

    name: str
    ne: tuple[int, ...]

    @property
    def elements(self) -> int:
        total = 1
        for dim in self.ne:
            total *= dim
        return total


@dataclass(frozen=True)
class ModelShape:
    """What the rules read from the hyperparameters."""

    n_layer: int
    n_gqa: int  # attention heads per KV head


def _more_bits(i_layer: int, n_layers: int) -> bool:
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def quantized(tensor: GGUFTensor) -> bool:
    """llama-quantize's choice of what to quantize at all (2-D weights that are not norms): the
    only tensors an override can name."""
    name = tensor.name
    return name.endswith("weight") and len(tensor.ne) >= 2 and "_norm.weight" not in name


@dataclass(frozen=True)
class Overrides:
    """llama-quantize's ``--tensor-type PATTERN=TYPE`` (in order), ``--output-tensor-type`` and
    ``--token-embedding-type``; types are ggml's upper-case names."""

    tensor_types: tuple[tuple[str, str], ...] = ()
    output: str | None = None
    token_embedding: str | None = None

    def __bool__(self) -> bool:
        return bool(self.tensor_types) or self.output is not None or self.token_embedding is not None


@dataclass(frozen=True)
class Decision:
    """The override that decides one tensor's type: ``source`` is its pattern, or
    ``output_tensor_type`` / ``token_embedding_type``; ``fallback``: llama.cpp still applies its
    row-width fallback to it (a pattern, or the output type on a tied token embedding)."""

    source: str
    type: str
    fallback: bool


def override_decisions(tensors: list[GGUFTensor], overrides: Overrides) -> dict[str, Decision]:
    """Tensor name -> the override llama.cpp applies to it, for each quantized tensor one names."""
    has_output = any(t.name == "output.weight" for t in tensors)
    compiled = [(pattern, re.compile(pattern), kind) for pattern, kind in overrides.tensor_types]
    out: dict[str, Decision] = {}
    for tensor in filter(quantized, tensors):
        name = tensor.name
        first = next(((p, kind) for p, regex, kind in compiled if regex.search(name)), None)
        named_layer_embd = name == "per_layer_token_embd.weight" and first is not None
        if overrides.token_embedding is not None and name in _TOKEN_EMBD and not named_layer_embd:
            out[name] = Decision("token_embedding_type", overrides.token_embedding, fallback=False)
        elif overrides.output is not None and name == "output.weight":
            out[name] = Decision("output_tensor_type", overrides.output, fallback=False)
        elif first is not None:
            out[name] = Decision(first[0], first[1], fallback=True)
        elif overrides.output is not None and not has_output and name in _TOKEN_EMBD:
            out[name] = Decision("output_tensor_type", overrides.output, fallback=True)
    return out


def tensor_types(
    tensors: list[GGUFTensor],
    file_type: str,
    shape: ModelShape,
    imatrix: bool,
    overrides: Overrides | None = None,
) -> dict[str, str]:
    """Tensor name -> ggml type of a ``file_type`` quantization with ``overrides`` (1-D tensors
    stay F32, as the converter writes them)."""
    default = DEFAULT_TYPE[file_type]
    decisions = override_decisions(tensors, overrides) if overrides else {}
    rules = _Rules(
        ftype=file_type,
        shape=shape,
        has_output=any(t.name == "output.weight" for t in tensors),
        imatrix=imatrix,
        n_attention_wv=sum(1 for t in tensors if "attn_v.weight" in t.name or "attn_qkv.weight" in t.name),
    )
    out: dict[str, str] = {}
    for tensor in tensors:
        decision = decisions.get(tensor.name)
        if not quantized(tensor):
            out[tensor.name] = "F32" if len(tensor.ne) < 2 else "F16"
        elif decision is not None and not decision.fallback:  # returned before any mix rule
            out[tensor.name] = decision.type
        elif default in _UNQUANTIZED:  # llama.cpp applies patterns only to quantized file types
            out[tensor.name] = default
        elif decision is not None:  # skips the mix rules and their counters
            out[tensor.name] = fallback(tensor.ne[0], decision.type)
        else:
            out[tensor.name] = _tensor_type(tensor, default, rules)
    return out


@dataclass
class _Rules:
    """The file-wide inputs of the rules, and the per-kind counters they advance in file order."""

    ftype: str
    shape: ModelShape
    has_output: bool
    imatrix: bool
    n_attention_wv: int
    counters: dict[str, int] = field(default_factory=lambda: {"attn_v": 0, "ffn_down": 0})


def _tensor_type(tensor: GGUFTensor, new_type: str, rules: _Rules) -> str:
    name, nx = tensor.name, tensor.ne[0]
    n_layer, gqa = rules.shape.n_layer, rules.shape.n_gqa
    ftype, has_output, imatrix = rules.ftype, rules.has_output, rules.imatrix
    counters, n_attention_wv = rules.counters, rules.n_attention_wv
    if name == "output.weight" or (not has_output and name == "token_embd.weight"):
        if nx % BLOCKS[new_type][0] != 0:
            return "Q8_0"
        if ftype in ("IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"):
            new_type = "Q5_K"
        elif new_type != "Q8_0":
            new_type = "Q6_K"
    elif name == "token_embd.weight":
        if ftype in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
            new_type = "Q2_K"
        elif ftype in ("IQ2_S", "IQ2_M", "IQ3_XXS"):
            new_type = "IQ3_S"
    elif ftype in _LOW_IQ:
        if "attn_v.weight" in name:
            low = "IQ3_S" if ftype in ("IQ2_S", "IQ2_M") else "Q2_K"
            new_type = "Q4_K" if gqa >= 4 else low
            counters["attn_v"] += 1
        elif "ffn_down" in name:
            if counters["ffn_down"] < n_layer // 8:
                new_type = "IQ3_S" if ftype in ("IQ2_S", "IQ2_M") else "Q2_K"
            counters["ffn_down"] += 1
        elif "attn_output.weight" in name:
            if ftype in ("IQ1_S", "IQ1_M"):
                new_type = "IQ2_XXS"
            elif ftype in ("IQ2_S", "IQ2_M"):
                new_type = "IQ3_S"
    elif "attn_v.weight" in name:
        new_type = _attn_v(new_type, ftype, gqa, imatrix, counters["attn_v"], n_attention_wv)
        counters["attn_v"] += 1
    elif "attn_k.weight" in name or "attn_q.weight" in name:
        if ftype == "IQ3_XS":
            new_type = "IQ3_XXS"
        elif ftype == "IQ3_XXS":
            new_type = "IQ2_S"
    elif "ffn_down" in name:
        new_type = _ffn_down(new_type, ftype, imatrix, counters["ffn_down"], n_layer)
        counters["ffn_down"] += 1
    elif "attn_output.weight" in name:
        new_type = _ATTN_OUTPUT.get(ftype, new_type)
    elif "attn_qkv.weight" in name:
        if ftype in ("Q3_K_M", "Q3_K_L", "IQ3_M"):
            new_type = "Q4_K"
        elif ftype == "Q4_K_M":
            new_type = "Q5_K"
        elif ftype == "Q5_K_M":
            new_type = "Q6_K"
    elif ("ffn_gate" in name or "ffn_up" in name) and ftype == "IQ3_XS":
        key = "ffn_gate" if "ffn_gate" in name else "ffn_up"
        i_layer = counters.get(key, 0)
        if n_layer // 8 <= i_layer < 7 * n_layer // 8:
            new_type = "IQ3_XXS"
        counters[key] = i_layer + 1
    return fallback(nx, new_type)


def fits(width: int, ggml_type: str) -> bool:
    """Whether rows of ``width`` weights are whole blocks of ``ggml_type``."""
    return width % BLOCKS[ggml_type][0] == 0


def fallback(width: int, ggml_type: str) -> str:
    """The type llama.cpp writes for rows of ``width`` when ``ggml_type`` is asked for."""
    if fits(width, ggml_type):
        return ggml_type
    chosen = FALLBACK.get(ggml_type, ggml_type)
    return chosen if fits(width, chosen) else "F16"


def _attn_v(new_type: str, ftype: str, gqa: int, imatrix: bool, i: int, n: int) -> str:
    if ftype == "Q2_K":
        return "Q4_K" if gqa >= 4 else "Q3_K"
    if ftype == "Q2_K_S" and gqa >= 4:
        return "Q4_K"
    if ftype == "IQ3_XXS":
        return "Q4_K" if gqa >= 4 else ("IQ3_S" if not imatrix else "IQ3_XXS")
    if ftype in ("IQ3_XS", "IQ3_S") and gqa >= 4:
        return "Q4_K"
    if ftype == "IQ3_M":
        return "Q4_K"
    if ftype == "Q3_K_M":
        return "Q5_K" if i < 2 else "Q4_K"
    if ftype == "Q3_K_L":
        return "Q5_K"
    if ftype in ("IQ4_NL", "IQ4_XS") and gqa >= 4:
        return "Q5_K"
    if ftype in ("Q4_K_M", "Q5_K_M") and _more_bits(i, n):
        return "Q6_K"
    if ftype == "Q4_K_S" and i < 4:
        return "Q5_K"
    return new_type


def _ffn_down(new_type: str, ftype: str, imatrix: bool, i: int, n: int) -> str:
    if ftype == "Q2_K":
        return "Q3_K"
    if ftype == "Q2_K_S":
        return "Q4_K" if i < n // 8 else new_type
    if ftype == "IQ3_XXS" and not imatrix:
        return "Q4_K" if i < n // 8 else "Q3_K"
    if ftype == "Q3_K_M":
        return "Q5_K" if i < n // 16 else "Q4_K"
    if ftype == "IQ3_M" and i < n // 8:
        return "Q4_K"
    if ftype == "Q3_K_L":
        return "Q5_K"
    if ftype == "Q4_K_M":
        return "Q6_K" if _more_bits(i, n) else new_type
    if i < n // 8 and ftype in ("IQ4_NL", "IQ4_XS") and not imatrix:
        return "Q5_K"
    if ftype == "Q5_K_M" and _more_bits(i, n):
        return "Q6_K"
    if ftype == "Q4_K_S" and i < n // 8:
        return "Q5_K"
    if ftype in ("Q4_0", "Q5_0") and imatrix and i < n // 8:
        return "Q4_1" if ftype == "Q4_0" else "Q5_1"
    return new_type


def tensor_bytes(tensor: GGUFTensor, ggml_type: str) -> int:
    """Bytes of ``tensor`` stored as ``ggml_type``."""
    block, size = BLOCKS[ggml_type]
    return tensor.elements // block * size
