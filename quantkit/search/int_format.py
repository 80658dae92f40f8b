"""The integer side of sensitivity and search: per-layer W8 / W4 mixes for GPTQ and AWQ (llm-compressor).

Works on the Hugging Face model itself (no GGUF): its decoder layers' linear modules are the
tensors, named as compressed-tensors names them (``model.layers.3.mlp.down_proj``), grouped into
the same units as the GGUF profile (``layer N``; ``attn_q`` ... ``ffn_down`` by module role).

- **proxy**: the GGUF proxy's formula with compressed-tensors' group-wise integer rounding
  (``fake_quantize``: symmetric for GPTQ, with a zero point for AWQ, as their recipes default) in
  place of a GGUF type: ``sum_j E[x_j^2] sum_i dW_ij^2`` over
  the calibration tokens, divided by the residual stream's mean squared norm entering the layer.
- **measured**: every linear module rounded to ``base`` bits except the unit's, rounded to ``low``,
  in the loaded model's own weights (round to nearest, no GPTQ error feedback), scored in
  transformers on the eval windows against the cached baseline reference. One model load, one
  evaluation per unit; no quantized checkpoint is written.

Group size: the largest of 128, 64, 32 that divides every quantized layer's input width (576-wide
SmolLM2 takes 64), the same for every layer of a mix.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import JsonValue

from quantkit.backends.int_overrides import int_effective_bits
from quantkit.errors import RecipeError
from quantkit.search.units import TensorScore, Unit, calibration_of

if TYPE_CHECKING:
    import torch

    from quantkit.inputs.models import ModelSource
    from quantkit.inputs.recipe import Recipe
    from quantkit.runtimes.hf import HFRuntime
    from quantkit.stages.context import Tokens
    from quantkit.util.progress import Reporter

INT_TYPES = ("W8", "W4")
GROUP_SIZES = (128, 64, 32)
# module role -> the tensor class the GGUF profile names it by (llama, qwen, mistral, gemma)
ROLES = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_output",
    "gate_proj": "ffn_gate",
    "up_proj": "ffn_up",
    "down_proj": "ffn_down",
}
_LINEAR = re.compile(r"^(?P<prefix>(?:.+\.)?layers)\.(?P<layer>\d+)\.(?P<path>.+)$")


def symmetric_in(format: str) -> bool:
    """Whether a format's mixes are symmetric: GPTQ's recipes are, AWQ's keep a zero point."""
    return format != "awq"


def type_bits(group_size: int | None, symmetric: bool = True) -> dict[str, float]:
    """Bits per weight of each integer type, the fp16 scale (and zero point) per group included."""
    return {kind: int_effective_bits(int(kind[1:]), group_size, symmetric) for kind in INT_TYPES}


def group_size_for(widths: Sequence[int]) -> int | None:
    """The largest of 128, 64, 32 that divides every width; None (per channel) if none does."""
    return next((g for g in GROUP_SIZES if all(width % g == 0 for width in widths)), None)


def fake_quantize(
    weight: torch.Tensor, bits: int, group_size: int | None, symmetric: bool = True
) -> torch.Tensor:
    """``weight`` rounded as compressed-tensors' integer scheme stores it, per row and group of
    input columns: symmetric, scale ``max|w| / ((2^bits - 1) / 2)``; asymmetric, scale
    ``(max - min) / (2^bits - 1)`` (the range widened to hold 0) and a rounded zero point."""
    rows, columns = weight.shape
    group = group_size or columns
    values = weight.float().reshape(rows, columns // group, group)
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    if symmetric:
        scale = (values.abs().amax(-1, keepdim=True) / ((high - low) / 2)).clamp(min=1e-12)
        codes = (values / scale).round().clamp(low, high)
        return (codes * scale).reshape(rows, columns).to(weight.dtype)
    smallest = values.amin(-1, keepdim=True).clamp(max=0)
    largest = values.amax(-1, keepdim=True).clamp(min=0)
    scale = ((largest - smallest) / (high - low)).clamp(min=1e-12)
    zero = (low - smallest / scale).clamp(low, high).round()
    codes = (values / scale + zero).round().clamp(low, high)
    return ((codes - zero) * scale).reshape(rows, columns).to(weight.dtype)


def tensor_kind(name: str) -> tuple[int, str] | None:
    """(layer, class) of a decoder layer's linear module name, or None."""
    match = _LINEAR.match(name)
    if match is None:
        return None
    role = match.group("path").rsplit(".", 1)[-1]
    return int(match.group("layer")), ROLES.get(role, role)


@dataclass
class IntBench:
    """The model loaded once in the baseline precision, its tokens, and its quantizable layers."""

    recipe: Recipe
    source: ModelSource
    tokens: Tokens
    device: str
    runtime: HFRuntime
    linears: dict[str, torch.nn.Linear]
    group_size: int | None
    reporter: Reporter
    symmetric: bool = True

    def close(self) -> None:
        self.runtime.close()


def int_recipe(recipe: Recipe, group_size: int | None, method: str = "gptq") -> Recipe:
    """``recipe``'s model, eval, calibration and device as a W4 recipe of ``method``, ``group_size``."""
    from quantkit.inputs.recipe import validate_recipe

    data = recipe.model_dump(mode="json", exclude={"method", "options", "gates"})
    return validate_recipe(data | {"method": method, "options": {"bits": 4, "group_size": group_size}})


def open_int_bench(
    recipe: Recipe, trust_remote_code: bool, reporter: Reporter, method: str = "gptq"
) -> IntBench:
    """Resolve the model, check ``method`` (gptq, awq) can take it, and load it once in transformers."""
    import torch

    from quantkit.device import resolve_device
    from quantkit.inputs.models import read_config, resolve_model
    from quantkit.inputs.plan import tensor_shapes
    from quantkit.runtimes.base import RuntimeSettings
    from quantkit.runtimes.hf import HFRuntime
    from quantkit.stages.context import Tokens
    from quantkit.stages.reference import BaselineInputs

    source = resolve_model(recipe.model or "smollm2-135m", trust_remote_code=trust_remote_code)
    widths = [
        shape[1]
        for name, (shape, _) in tensor_shapes(source.path).items()
        if len(shape) == 2 and name.endswith(".weight") and tensor_kind(name.removesuffix(".weight"))
    ]
    if not widths:
        raise RecipeError(
            f"'{source.spec}' has no decoder-layer linear weights {method.upper()} could quantize",
            "search it with --formats gguf",
        )
    group_size = group_size_for(widths)
    int_recipe(recipe, group_size, method).backend().check_model(read_config(source.path))
    tokens = Tokens(recipe, source, True, trust_remote_code)
    device = resolve_device(recipe.device)
    inputs = BaselineInputs(recipe, source, device, tokens, trust_remote_code)
    settings = RuntimeSettings(
        device=device,
        context_length=tokens.eval_windows().seq_len,
        trust_remote_code=trust_remote_code,
        dtype=inputs.dtype,
    )
    with reporter.stage("loading the model (transformers)"):
        runtime = HFRuntime.load(source.path, settings)
    linears = {
        name: module
        for name, module in runtime.model.named_modules()
        if isinstance(module, torch.nn.Linear) and tensor_kind(name) is not None
    }
    return IntBench(
        recipe, source, tokens, device, runtime, linears, group_size, reporter, symmetric_in(method)
    )


def int_proxy_scores(bench: IntBench) -> tuple[list[TensorScore], float, list[float]]:
    """The proxy error of every decoder linear module at every integer type, relative to the
    residual stream entering its layer; with its seconds and the residual norms."""
    import torch

    from quantkit.backends import imatrix

    start = time.perf_counter()
    calibration = calibration_of(bench.tokens)
    with bench.reporter.stage("importance matrix (one pass over the calibration windows)"):
        names = {module: name for name, module in bench.linears.items()}
        computed = imatrix.collect(bench.runtime.model, calibration, names, bench.device)
    matrix, residual = computed.means(), computed.residual
    scored: list[TensorScore] = []
    with torch.inference_mode():
        for name, module in bench.linears.items():
            located = tensor_kind(name)
            column = matrix.get(name)
            if located is None or column is None:
                continue
            layer, kind = located
            weight = module.weight.detach().float()
            importance = torch.as_tensor(column, dtype=torch.float64, device=weight.device)
            stream = residual[layer] if layer < len(residual) and residual[layer] > 0 else 1.0
            proxy = {}
            for kind_name in INT_TYPES:
                error = weight - fake_quantize(weight, int(kind_name[1:]), bench.group_size, bench.symmetric)
                proxy[kind_name] = float(error.double().square().sum(0) @ importance) / stream
            scored.append(
                TensorScore(
                    name=name,
                    layer=layer,
                    kind=kind,
                    params=int(weight.numel()),
                    width=int(weight.shape[1]),
                    proxy=proxy,
                )
            )
    return scored, round(time.perf_counter() - start, 3), [round(value, 4) for value in residual]


def int_measure(
    bench: IntBench, units: Sequence[Unit], base: str, low: str
) -> tuple[float, dict[str, float]]:
    """The all-``base`` model's KLD and each unit's KLD with only it at ``low`` (round to nearest,
    in the loaded weights, restored afterwards)."""
    import torch

    from quantkit.stages.reference import BaselineInputs, ensure_reference

    inputs = BaselineInputs(bench.recipe, bench.source, bench.device, bench.tokens)
    reference, _ = ensure_reference(inputs, bench.reporter)
    score = _scorer(bench, reference)
    weights = {name: module.weight for name, module in bench.linears.items()}
    original = {name: weight.detach().clone() for name, weight in weights.items()}
    with torch.inference_mode():
        at_base = {
            name: fake_quantize(value, int(base[1:]), bench.group_size, bench.symmetric)
            for name, value in original.items()
        }
        try:
            with bench.reporter.stage(
                f"measuring: all {base}, then each unit at {low}", total=len(units) + 1
            ) as step:
                for name, value in at_base.items():
                    weights[name].copy_(value)
                base_kld = score()
                step(1)
                klds: dict[str, float] = {}
                for unit in units:
                    for name in unit.members:
                        rounded = fake_quantize(
                            original[name], int(low[1:]), bench.group_size, bench.symmetric
                        )
                        weights[name].copy_(rounded)
                    klds[unit.name] = score()
                    for name in unit.members:
                        weights[name].copy_(at_base[name])
                    step(1)
        finally:
            for name, value in original.items():
                weights[name].copy_(value)
    return base_kld, klds


def _scorer(bench: IntBench, reference: object) -> Callable[[], float]:
    from quantkit.evals.quality import score, scored_positions
    from quantkit.evals.reference import Reference

    assert isinstance(reference, Reference)
    windows = bench.tokens.eval_windows()
    positions = scored_positions(bench.recipe.eval.score, windows.seq_len)

    def run() -> float:
        scores = score(bench.runtime, windows, reference, bench.recipe.eval.batch_size)
        return float(scores.at(positions).kld.mean())

    return run


def int_others(bench: IntBench, tensors: Sequence[TensorScore]) -> tuple[int, float]:
    """Parameters the integer formats leave unquantized (embedding, norms, an untied head) and
    their bits as the checkpoint stores them."""
    from quantkit.inputs.plan import tensor_shapes

    inside = {f"{t.name}.weight" for t in tensors}
    params, bits = 0, 0.0
    for name, (shape, dtype) in tensor_shapes(bench.source.path).items():
        if name in inside:
            continue
        count = 1
        for size in shape:
            count *= size
        params += count
        bits += count * _DTYPE_BITS.get(dtype, 16)
    return params, bits


_DTYPE_BITS = {"F32": 32, "F16": 16, "BF16": 16, "F64": 64, "I64": 64, "I32": 32, "I8": 8, "U8": 8}


def int_mix_options(
    mix: Mapping[str, str], group_size: int | None, symmetric: bool = True
) -> dict[str, JsonValue]:
    """GPTQ / AWQ recipe options for ``mix``: the most common type as the scheme, every module of
    another type named by one override per type (a ``re:`` target per module role, listing its
    layers), so each module is named once; bits only, which AWQ's overrides take too."""
    counts: dict[str, int] = {}
    for kind in mix.values():
        counts[kind] = counts.get(kind, 0) + 1
    base = max(INT_TYPES, key=lambda kind: (counts.get(kind, 0), -INT_TYPES.index(kind)))
    groups: dict[tuple[str, str, str], list[int]] = {}
    layers_of: dict[tuple[str, str], set[int]] = {}
    for name, kind in mix.items():
        match = _LINEAR.match(name)
        if match is None:
            continue
        key = (match.group("prefix"), match.group("path"))
        layers_of.setdefault(key, set()).add(int(match.group("layer")))
        if kind != base:
            groups.setdefault((kind, *key), []).append(int(match.group("layer")))
    overrides: list[JsonValue] = []
    for kind in INT_TYPES:
        targets: list[JsonValue] = []
        for (other, prefix, path), layers in sorted(groups.items()):
            if other != kind:
                continue
            every = set(layers) == layers_of[(prefix, path)]
            listed = r"\d+" if every else "(" + "|".join(str(i) for i in sorted(layers)) + ")"
            targets.append(f"re:{re.escape(prefix)}\\.{listed}\\.{re.escape(path)}$")
        if targets:
            overrides.append({"targets": targets, "bits": int(kind[1:])})
    options: dict[str, JsonValue] = {"bits": int(base[1:]), "group_size": group_size, "symmetric": symmetric}
    if overrides:
        options["overrides"] = overrides
    return options
