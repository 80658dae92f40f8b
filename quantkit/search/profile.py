"""Sensitivity of a model's parts to GGUF quantization: measured through llama.cpp, and a proxy
computed from the weights alone.

A *unit* is a decoder layer (every quantized tensor of ``blk.N``) or a tensor class (one kind of
tensor in every layer: ``attn_q``, ..., ``ffn_down``; the token embedding; an untied output).

- **measured**: the GGUF is quantized with every tensor at the high-precision ``base`` type except
  the unit's, which get the ``low`` type (llama.cpp's quantize with per-tensor overrides), and
  scored in llama.cpp on the eval windows against the cached baseline reference. The unit's
  score is its KLD minus the all-``base`` file's KLD. Cost: two llama.cpp quantizations (each
  unit's file is spliced from them, ``quantkit.llamacpp.gguf_splice``) and ``1 + units`` evaluations of
  the eval windows (one forward pass of each window per evaluation).
- **proxy**: for every quantized tensor and every legacy type (``PROXY_TYPES``), the expected
  squared output error ``E||(W - Q(W)) x||^2`` over the calibration tokens, with the diagonal
  approximation ``sum_j E[x_j^2] sum_i dW_ij^2`` (``E[x_j^2]`` is the importance matrix). The
  embedding's rows are weighted by how often each token occurs in the calibration windows.
  Each tensor's error is then divided by the mean squared norm of the residual stream where it
  acts (entering its decoder layer; the embedding's own output; the output head's input): later
  layers see the stream through a normalization, so what matters is the error relative to the
  stream, which grows ~250x through SmolLM2's 30 layers. Without that division the proxy rose
  with depth where the measured KLD falls (Spearman -0.17 over SmolLM2's layers; with it 0.84).
  Cost: one forward pass of the calibration windows (the importance matrix and the residual
  norms) and numpy quantization of the weights; no forward pass per candidate.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field, JsonValue

from quantkit.errors import RecipeError
from quantkit.search.int_format import (
    INT_TYPES,
    int_measure,
    int_others,
    int_proxy_scores,
    open_int_bench,
    symmetric_in,
    type_bits,
)
from quantkit.search.units import CLASSES, EMBEDDING, OUTPUT, TensorScore, Unit, calibration_of, units_of

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from quantkit.evals.reference import Reference
    from quantkit.inputs.models import ModelSource
    from quantkit.inputs.recipe import Recipe
    from quantkit.stages.context import Tokens
    from quantkit.util.progress import Reporter

# the types gguf-py quantizes in numpy (32-weight blocks: they fit every row width of SmolLM2-like
# models), from the most bits to the fewest
PROXY_TYPES = ("Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0")
BITS = {"Q8_0": 8.5, "Q5_1": 6.0, "Q5_0": 5.5, "Q4_1": 5.0, "Q4_0": 4.5, "F16": 16.0}
# rows per tensor the proxy quantizes (evenly spaced; the error is scaled to all rows): rows are
# quantized independently, so this estimates the whole tensor's error at a fraction of the time
SAMPLED_ROWS = 256
_LAYER = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.weight$")
SearchFormat = Literal["gguf", "gptq", "awq"]
SEARCH_FORMATS: tuple[SearchFormat, ...] = ("gguf", "gptq", "awq")
INT_FORMATS = ("gptq", "awq")  # integer weights through llm-compressor, per-layer bits
# the part measured and the rest, unless --low / --base say otherwise
DEFAULT_TYPES: dict[str, tuple[str, str]] = {
    "gguf": ("Q8_0", "Q4_0"),
    "gptq": ("W8", "W4"),
    "awq": ("W8", "W4"),
}


def ladder(format: str, group_size: int | None = None) -> tuple[tuple[str, ...], dict[str, float]]:
    """A format's types from the most bits to the fewest, and each type's bits per weight."""
    if format in INT_FORMATS:
        return INT_TYPES, type_bits(group_size, symmetric_in(format))
    return PROXY_TYPES, BITS


class UnitScore(BaseModel):
    """One unit of the profile: its proxy (summed over its tensors) and its measured KLD increase."""

    unit: str
    kind: Literal["layer", "class"]
    tensors: int
    params: int
    proxy: float
    kld: float | None = None
    kld_increase: float | None = None


class Profile(BaseModel):
    """What ``quantkit sensitivity`` writes (``sensitivity.json``)."""

    model: str
    format: SearchFormat = "gguf"
    group_size: int | None = Field(None, description="the integer types' group size (gptq, awq)")
    base: str
    low: str
    eval: dict[str, int]
    base_kld: float | None = None
    other_params: int = Field(0, description="parameters of the tensors outside the profile (norms, ...)")
    other_bits: float = Field(0.0, description="their bits in a file of the base type")
    units: list[UnitScore]
    tensors: list[TensorScore]
    spearman: dict[str, float | None] = Field(default_factory=dict)
    cost: dict[str, float | int] = Field(default_factory=dict)
    residual_norms: list[float] = Field(
        default_factory=list, description="E||h||^2 entering each decoder layer, then leaving the last"
    )

    def layer_units(self) -> list[UnitScore]:
        return [unit for unit in self.units if unit.kind == "layer"]

    def class_units(self) -> list[UnitScore]:
        return [unit for unit in self.units if unit.kind == "class"]

    def types(self) -> tuple[tuple[str, ...], dict[str, float]]:
        """This profile's ladder of types and their bits per weight."""
        return ladder(self.format, self.group_size)


@dataclass
class Workbench:
    """What every measurement shares: the model, its unquantized GGUF and tokens, the reference."""

    recipe: Recipe
    source: ModelSource
    tokens: Tokens
    device: str
    base_gguf: Path
    reporter: Reporter


def check_types(base: str, low: str, format: str = "gguf") -> None:
    """``base`` and ``low`` must be types of ``format``'s ladder (for GGUF: legacy types quantkit
    can score with the proxy too)."""
    types, bits = ladder(format)
    why = "integer bits, 16-bit activations"
    if format == "gguf":
        why = "32-weight blocks: they fit every row width"
    for what, kind in (("--base", base), ("--low", low)):
        if kind not in types:
            raise RecipeError(
                f"{what} {kind} is not a type the {format} sensitivity profile uses",
                f"pick one of {', '.join(types)} ({why})",
            )
    if bits[low] >= bits[base]:
        raise RecipeError(f"--low {low} has no fewer bits than --base {base}", "e.g. --base Q8_0 --low Q4_0")


def open_workbench(recipe: Recipe, trust_remote_code: bool, reporter: Reporter) -> Workbench:
    """Resolve the model, check it can become a GGUF, and convert it (cached)."""
    from quantkit.device import resolve_device
    from quantkit.inputs.models import read_config, resolve_model
    from quantkit.stages.context import Tokens

    source = resolve_model(recipe.model or "smollm2-135m", trust_remote_code=trust_remote_code)
    backend = recipe.backend()
    backend.check_model(read_config(source.path))
    tokens = Tokens(recipe, source, True, trust_remote_code)
    with reporter.stage("converting to GGUF (cached)"):
        base_gguf = backend.runtime_baseline(source.path, reporter.log)
    if base_gguf is None:
        raise RecipeError("this recipe's backend makes no GGUF", "use a gguf recipe")
    return Workbench(recipe, source, tokens, resolve_device(recipe.device), base_gguf, reporter)


def proxy_scores(bench: Workbench) -> tuple[list[TensorScore], float, list[float]]:
    """The proxy error of every quantized tensor at every ``PROXY_TYPES`` type, relative to the
    residual stream where it acts; with its seconds and the residual norms."""
    import gguf
    import numpy as np

    from quantkit.backends import imatrix
    from quantkit.backends.gguf import inspect_gguf

    start = time.perf_counter()
    info = inspect_gguf(bench.base_gguf)
    calibration = calibration_of(bench.tokens)
    with bench.reporter.stage("importance matrix (one pass over the calibration windows)"):
        computed = imatrix.compute(
            bench.source.path, calibration, info.architecture or "", info.input_widths, bench.device
        )
    matrix, residual = computed.means(), computed.residual
    counts = np.bincount(np.asarray(calibration.ids).reshape(-1))
    reader = gguf.GGUFReader(bench.base_gguf)
    scored: list[TensorScore] = []
    candidates = [t for t in reader.tensors if len(t.shape) >= 2 and _kind(t.name) is not None]
    with bench.reporter.stage("proxy: quantization error per tensor and type", total=len(candidates)) as step:
        for tensor in candidates:
            weights: npt.NDArray[np.float32] = np.asarray(tensor.data, dtype=np.float32).reshape(
                -1, int(tensor.shape[0])
            )
            if tensor.name == EMBEDDING:
                seen = np.nonzero(counts)[0]
                weights, column = weights[seen], None
                row_weight: npt.NDArray[np.float64] | None = counts[seen].astype(np.float64) / counts.sum()
            else:
                column = matrix.get(tensor.name)
                if column is None:
                    step(1)
                    continue
                row_weight = None
            scale = 1.0
            if row_weight is None and len(weights) > SAMPLED_ROWS:  # rows are quantized one by one
                picked = np.linspace(0, len(weights) - 1, SAMPLED_ROWS).round().astype(np.int64)
                weights, scale = weights[picked], len(weights) / SAMPLED_ROWS
            weights = np.ascontiguousarray(weights)
            match = _LAYER.match(tensor.name)
            scale /= _stream(residual, tensor.name, int(match.group(1)) if match else None)
            proxy = {kind: scale * _error(weights, kind, column, row_weight) for kind in PROXY_TYPES}
            scored.append(
                TensorScore(
                    name=tensor.name,
                    layer=int(match.group(1)) if match else None,
                    kind=str(_kind(tensor.name)),
                    params=int(tensor.n_elements),
                    width=int(tensor.shape[0]),
                    proxy=proxy,
                )
            )
            step(1)
    return scored, round(time.perf_counter() - start, 3), [round(value, 4) for value in residual]


def _stream(residual: Sequence[float], name: str, layer: int | None) -> float:
    """E||h||^2 of the residual stream where tensor ``name`` acts (1 where it was not measured):
    entering its layer; the embedding's output (entering layer 0); the head's input."""
    index = layer if layer is not None else (0 if name == EMBEDDING else len(residual) - 1)
    value = residual[index] if 0 <= index < len(residual) else 0.0
    return value if value > 0 else 1.0


def _kind(name: str) -> str | None:
    match = _LAYER.match(name)
    if match:
        return match.group(2) if match.group(2) in CLASSES else None
    return name if name in (EMBEDDING, OUTPUT) else None


def _error(
    weights: npt.NDArray[np.float32],
    kind: str,
    column: npt.NDArray[np.float32] | None,
    row_weight: npt.NDArray[np.float64] | None,
) -> float:
    """``sum_ij c_j r_i (W - Q(W))_ij^2``: columns weighted by E[x_j^2], rows by token frequency."""
    import gguf
    import numpy as np

    qtype = gguf.GGMLQuantizationType[kind]
    error = weights - gguf.quants.dequantize(gguf.quants.quantize(weights, qtype), qtype)
    squared = np.square(error, dtype=np.float64)
    if column is not None:
        return float(squared.sum(0) @ column.astype(np.float64))
    if row_weight is not None:
        return float(row_weight @ squared.sum(1))
    return float(squared.sum())


def measure(bench: Workbench, units: Sequence[Unit], base: str, low: str) -> tuple[float, dict[str, float]]:
    """The all-``base`` file's KLD and each unit's KLD with only it at ``low``.

    The model is quantized twice by llama.cpp (all ``base``; every tensor at ``low``) and each
    unit's file is spliced from the two (``quantkit.llamacpp.gguf_splice``: byte for byte what llama.cpp
    writes with the unit's override), so each unit costs a copy and an evaluation.
    """
    import tempfile

    from quantkit.llamacpp.gguf_splice import splice
    from quantkit.stages.reference import BaselineInputs, ensure_reference

    inputs = BaselineInputs(bench.recipe, bench.source, bench.device, bench.tokens)
    reference, _ = ensure_reference(inputs, bench.reporter)
    with tempfile.TemporaryDirectory(prefix="quantkit-sensitivity-") as tmp:
        folder = Path(tmp)
        with bench.reporter.stage(f"quantizing all-{base} and all-{low} with llama.cpp"):
            all_base, all_low = folder / "base.gguf", folder / "low.gguf"
            _quantize(bench, {"type": base, "outtype": "f16"}, all_base)
            _quantize(bench, {"type": base, "outtype": "f16", "tensor_types": {r"\.weight$": low}}, all_low)
        score = _scorer(bench, reference)
        with bench.reporter.stage(
            f"measuring: all {base}, then each unit at {low}", total=len(units) + 1
        ) as step:
            base_kld = score(all_base)
            step(1)
            klds: dict[str, float] = {}
            unit_file = folder / "unit.gguf"
            for unit in units:
                splice(all_base, all_low, unit.members, unit_file)
                klds[unit.name] = score(unit_file)
                step(1)
    return base_kld, klds


def _quantize(bench: Workbench, options: Mapping[str, object], target: Path) -> None:
    from quantkit.backends.gguf import GGUFOptions, llama_quantize
    from quantkit.util.progress import native_stderr_captured

    with native_stderr_captured(verbose=False):
        llama_quantize(bench.base_gguf, target, GGUFOptions.model_validate(options), None)


def _scorer(bench: Workbench, reference: Reference) -> Callable[[Path], float]:
    """A function that scores a GGUF file in llama.cpp and returns its mean KLD."""
    from quantkit.evals.quality import score, scored_positions
    from quantkit.runtimes.base import RuntimeSettings
    from quantkit.runtimes.llamacpp import LlamaCppRuntime

    windows = bench.tokens.eval_windows()
    positions = scored_positions(bench.recipe.eval.score, windows.seq_len)
    settings = RuntimeSettings(device=bench.device, context_length=windows.seq_len)

    def run(path: Path) -> float:
        runtime = LlamaCppRuntime.load(path, settings)
        try:
            scores = score(runtime, windows, reference, bench.recipe.eval.batch_size)
        finally:
            runtime.close()
        return float(scores.at(positions).kld.mean())

    return run


def spearman(left: Sequence[float], right: Sequence[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None under three points."""
    import numpy as np

    if len(left) < 3 or len(left) != len(right):
        return None

    def ranks(values: Sequence[float]) -> npt.NDArray[np.float64]:
        array = np.asarray(values, dtype=np.float64)
        order = array.argsort(kind="stable")
        out = np.empty(len(array))
        out[order] = np.arange(len(array), dtype=np.float64)
        for value in np.unique(array):  # ties share their mean rank
            same = array == value
            out[same] = out[same].mean()
        return out

    a, b = ranks(left), ranks(right)
    if a.std() == 0 or b.std() == 0:
        return None
    return round(float(np.corrcoef(a, b)[0, 1]), 4)


def unit_scores(
    tensors: Sequence[TensorScore], units: Sequence[Unit], low: str, base: str
) -> list[UnitScore]:
    """Each unit's proxy: its tensors' error at ``low`` minus their error at ``base``."""
    by_name = {t.name: t for t in tensors}
    out = []
    for unit in units:
        members = [by_name[name] for name in unit.members]
        proxy = sum(t.proxy[low] - t.proxy[base] for t in members)
        out.append(
            UnitScore(
                unit=unit.name,
                kind=unit.kind,
                tensors=len(members),
                params=sum(t.params for t in members),
                proxy=proxy,
            )
        )
    return out


@dataclass(frozen=True)
class ProfileRequest:
    """What ``quantkit sensitivity`` was asked."""

    recipe: Recipe
    base: str = "Q8_0"
    low: str = "Q4_0"
    measured: bool = True
    trust_remote_code: bool = False
    format: SearchFormat = "gguf"


@dataclass
class _Pieces:
    """What a format's profile is made of: its tensors' proxy, how to measure units, the rest."""

    spec: str
    tokens: Tokens
    tensors: list[TensorScore]
    proxy_s: float
    residual: list[float]
    measure: Callable[[Sequence[Unit]], tuple[float, dict[str, float]]]
    others: tuple[int, float]
    group_size: int | None = None
    close: Callable[[], None] = lambda: None


def _gguf_pieces(request: ProfileRequest, reporter: Reporter) -> _Pieces:
    bench = open_workbench(request.recipe, request.trust_remote_code, reporter)
    tensors, proxy_s, residual = proxy_scores(bench)
    return _Pieces(
        bench.source.spec,
        bench.tokens,
        tensors,
        proxy_s,
        residual,
        lambda units: measure(bench, units, request.base, request.low),
        _others(bench.base_gguf, tensors, request.base),
    )


def _int_pieces(request: ProfileRequest, reporter: Reporter) -> _Pieces:
    bench = open_int_bench(request.recipe, request.trust_remote_code, reporter, request.format)
    try:
        tensors, proxy_s, residual = int_proxy_scores(bench)
    except BaseException:
        bench.close()
        raise
    return _Pieces(
        bench.source.spec,
        bench.tokens,
        tensors,
        proxy_s,
        residual,
        lambda units: int_measure(bench, units, request.base, request.low),
        int_others(bench, tensors),
        bench.group_size,
        bench.close,
    )


def build_profile(request: ProfileRequest, reporter: Reporter) -> Profile:
    """Proxy always, measured unless asked not to; with the Spearman figures and the cost."""
    check_types(request.base, request.low, request.format)
    pieces = (_int_pieces if request.format in INT_FORMATS else _gguf_pieces)(request, reporter)
    try:
        return _profile(request, pieces)
    finally:
        pieces.close()


def _profile(request: ProfileRequest, pieces: _Pieces) -> Profile:
    tensors = pieces.tensors
    units = units_of(tensors)
    scores = unit_scores(tensors, units, request.low, request.base)
    windows = pieces.tokens.eval_windows()
    calibration = calibration_of(pieces.tokens)
    cost: dict[str, float | int] = {
        "proxy_s": pieces.proxy_s,
        "proxy_forward_passes": len(calibration.ids),
        "proxy_tokens": int(calibration.ids.size),
    }
    base_kld = None
    if request.measured:
        start = time.perf_counter()
        base_kld, klds = pieces.measure(units)
        for unit in scores:
            unit.kld = klds[unit.unit]
            unit.kld_increase = klds[unit.unit] - base_kld
        cost |= {
            "measured_s": round(time.perf_counter() - start, 3),
            "measured_evaluations": len(units) + 1,
            "measured_forward_passes": (len(units) + 1) * len(windows.ids),
            "measured_tokens": (len(units) + 1) * int(windows.ids.size),
        }
    other_params, other_bits = pieces.others
    profile = Profile(
        model=pieces.spec,
        format=request.format,
        group_size=pieces.group_size,
        other_params=other_params,
        other_bits=other_bits,
        base=request.base,
        low=request.low,
        eval={
            "num_windows": len(windows.ids),
            "seq_len": windows.seq_len,
            "first_window": request.recipe.eval.first_window,
        },
        base_kld=base_kld,
        units=scores,
        tensors=tensors,
        cost=cost,
        residual_norms=pieces.residual,
    )
    if request.measured:
        profile.spearman = correlations(profile)
    return profile


def _others(path: Path, tensors: Sequence[TensorScore], base: str) -> tuple[int, float]:
    """Parameters outside the profile and their bits: 1-D tensors in F32, the rest at ``base``."""
    from quantkit.llamacpp.gguf_file import read_gguf

    inside = {t.name for t in tensors}
    params, bits = 0, 0.0
    for tensor in read_gguf(path).tensors:
        if tensor.name not in inside:
            params += tensor.n_elements
            bits += tensor.n_elements * (32.0 if len(tensor.shape) < 2 else BITS[base])
    return params, bits


def correlations(profile: Profile) -> dict[str, float | None]:
    """Spearman of proxy vs measured KLD increase: over layers, over classes, over all units."""
    out: dict[str, float | None] = {}
    for key, units in (
        ("layers", profile.layer_units()),
        ("classes", profile.class_units()),
        ("all_units", profile.units),
    ):
        pairs = [(u.proxy, u.kld_increase) for u in units if u.kld_increase is not None]
        out[key] = spearman([p for p, _ in pairs], [m for _, m in pairs])
    return out


# eval and calibration of a profile or a search unless --set says otherwise: small enough for a
# CPU (every candidate is evaluated on them), the same for every candidate
DEFAULT_SETTINGS: dict[str, dict[str, JsonValue]] = {
    "eval": {"num_windows": 8, "seq_len": 256},
    "calibration": {"num_samples": 16, "seq_len": 256},
}


def profile_recipe(model: str | None, overrides: list[str], device: str | None, base: str = "Q8_0") -> Recipe:
    """The GGUF recipe whose eval, calibration, device and model a profile or a search uses;
    ``overrides`` are ``--set`` items on its fields (``eval.num_windows=4``)."""
    from quantkit.inputs.recipe import apply_overrides, validate_recipe

    data: dict[str, JsonValue] = {
        "name": "search",
        "method": "gguf",
        "options": {"type": base},
        "model": model,
        "device": device or "auto",
        **DEFAULT_SETTINGS,
    }
    return validate_recipe(apply_overrides(data, overrides))
