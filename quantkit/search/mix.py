"""Per-tensor mixes from a sensitivity profile: a greedy demotion path, and a mix as a recipe.

Every quantized tensor starts at the profile's ``base`` type. Each step of the path moves one
tensor to a type with fewer bits (the profile's ladder: GGUF's legacy types, or W8 -> W4 for
GPTQ and AWQ), the move with the smallest predicted error
increase per bit saved (ties broken by a seeded random order), until every tensor is at the
fewest-bit type. Predicted error is the proxy, scaled per unit by the measured profile when
there is one (``calibrated``), so a point on the path is a mix and its predicted KLD increase.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import JsonValue

from quantkit.search.profile import EMBEDDING, OUTPUT, Profile, TensorScore


@dataclass(frozen=True)
class Step:
    """One move of the path: ``tensor`` from ``before`` to ``after``; totals after the move."""

    tensor: str
    before: str
    after: str
    predicted: float
    bits: float


@dataclass(frozen=True)
class Path:
    """The demotion path and what the file holds besides the quantized tensors."""

    start: dict[str, str]
    steps: list[Step]
    start_bits: float
    start_predicted: float
    parameters: int
    other_bits: float

    def mix(self, index: int) -> dict[str, str]:
        """The types of every tensor after ``index`` steps."""
        types = dict(self.start)
        for step in self.steps[:index]:
            types[step.tensor] = step.after
        return types

    def bpw(self, index: int) -> float:
        """Predicted bits per weight of the whole file after ``index`` steps."""
        bits = self.start_bits if index == 0 else self.steps[index - 1].bits
        return (bits + self.other_bits) / self.parameters

    def predicted(self, index: int) -> float:
        return self.start_predicted if index == 0 else self.steps[index - 1].predicted


def calibrated(profile: Profile) -> dict[str, dict[str, float]]:
    """Each tensor's predicted error at each type, relative to its ``base`` type.

    With a measured profile, each tensor's proxy is scaled so that the proxy of every layer and
    every tensor class matches its measured KLD increase at ``low`` (iterative proportional
    fitting on the layer x class table); without one, the raw proxy.
    """
    base = profile.base
    types, _ = profile.types()
    table = {
        t.name: {kind: max(t.proxy[kind] - t.proxy[base], 0.0) for kind in types} for t in profile.tensors
    }
    measured = {u.unit: u.kld_increase for u in profile.units if u.kld_increase is not None}
    if not measured:
        return table
    scale = _fitted_scales(profile.tensors, table, profile.low, measured)
    return {name: {kind: value * scale[name] for kind, value in row.items()} for name, row in table.items()}


def _fitted_scales(
    tensors: Sequence[TensorScore],
    table: Mapping[str, Mapping[str, float]],
    low: str,
    measured: Mapping[str, float],
) -> dict[str, float]:
    """Per-tensor factors that make the summed errors at ``low`` match the measured units."""
    floor = max(max(measured.values()), 1e-9) * 1e-3  # a unit measured at or below zero still counts a little
    groups: list[tuple[float, list[str]]] = []
    for tensor in tensors:
        if tensor.layer is None:  # the embedding and the output: a class of their own
            groups.append((max(measured.get(tensor.name, floor), floor), [tensor.name]))
    for unit, target in measured.items():
        members = [
            t.name for t in tensors if t.layer is not None and (unit == t.kind or unit == f"layer {t.layer}")
        ]
        if members:
            groups.append((max(target, floor), members))
    scale = dict.fromkeys((t.name for t in tensors), 1.0)
    for _ in range(50):
        for target, members in groups:
            current = sum(table[name][low] * scale[name] for name in members)
            if current > 0:
                factor = target / current
                for name in members:
                    scale[name] *= factor
    return scale


def build_path(profile: Profile, errors: Mapping[str, Mapping[str, float]], seed: int) -> Path:
    """The greedy demotion path from every tensor at ``base`` to every tensor at the fewest bits."""
    import random

    rng = random.Random(seed)
    types, bits_of = profile.types()
    ladder = types[types.index(profile.base) :]
    tensors = {t.name: t for t in profile.tensors}
    order = list(tensors)
    rng.shuffle(order)
    tie = {name: index for index, name in enumerate(order)}
    state = dict.fromkeys(tensors, profile.base)
    bits = sum(bits_of[profile.base] * t.params for t in tensors.values())
    predicted = 0.0
    heap: list[tuple[float, int, str, str]] = []

    def push(name: str) -> None:
        move = _best_move(state[name], ladder, bits_of, errors[name], tensors[name].params)
        if move is not None:
            heapq.heappush(heap, (move[0], tie[name], name, move[1]))

    for name in tensors:
        push(name)
    steps = []
    while heap:
        _, _, name, after = heapq.heappop(heap)
        before = state[name]
        state[name] = after
        bits -= (bits_of[before] - bits_of[after]) * tensors[name].params
        predicted += errors[name][after] - errors[name][before]
        steps.append(Step(name, before, after, predicted, bits))
        push(name)
    quantized = sum(t.params for t in tensors.values())
    return Path(
        start=dict.fromkeys(tensors, profile.base),
        steps=steps,
        start_bits=sum(bits_of[profile.base] * t.params for t in tensors.values()),
        start_predicted=0.0,
        parameters=quantized + profile.other_params,
        other_bits=profile.other_bits,
    )


def _best_move(
    current: str, ladder: Sequence[str], bits: Mapping[str, float], errors: Mapping[str, float], params: int
) -> tuple[float, str] | None:
    """The lower type with the smallest error increase per bit saved (the lower convex hull)."""
    here = ladder.index(current)
    best: tuple[float, str] | None = None
    for kind in ladder[here + 1 :]:
        saved = (bits[current] - bits[kind]) * params
        cost = max(errors[kind] - errors[current], 0.0) / saved
        if best is None or cost < best[0]:
            best = (cost, kind)
    return best


def recipe_options(profile: Profile, mix: Mapping[str, str]) -> tuple[str, dict[str, JsonValue]]:
    """The recipe method and options that quantize ``mix`` in ``profile``'s format."""
    if profile.format != "gguf":
        from quantkit.search.int_format import int_mix_options, symmetric_in

        return profile.format, int_mix_options(mix, profile.group_size, symmetric_in(profile.format))
    return "gguf", mix_options(mix, profile.base)


def mix_options(mix: Mapping[str, str], base: str) -> dict[str, JsonValue]:
    """GGUF recipe options for ``mix``: ``base`` as the file type, every other type spelled out as
    one pattern per (tensor class, type) naming its layers, the embedding and output by option."""
    groups: dict[tuple[str, str], list[int]] = {}
    options: dict[str, JsonValue] = {"type": base, "outtype": "f16", "imatrix": False}
    for name, kind in sorted(mix.items()):
        if kind == base:
            continue
        if name == EMBEDDING:
            options["token_embedding_type"] = kind
            continue
        if name == OUTPUT:
            options["output_tensor_type"] = kind
            continue
        match = re.match(r"^blk\.(\d+)\.([a-z_]+)\.weight$", name)
        if match is None:
            continue
        groups.setdefault((match.group(2), kind), []).append(int(match.group(1)))
    every = {int(m.group(1)) for name in mix if (m := re.match(r"^blk\.(\d+)\.", name))}
    patterns: dict[str, JsonValue] = {}
    for (cls, kind), layers in sorted(groups.items()):
        listed = r"\d+" if set(layers) == every else "(" + "|".join(str(i) for i in sorted(layers)) + ")"
        patterns[rf"^blk\.{listed}\.{cls}\.weight$"] = kind
    if patterns:
        options["tensor_types"] = patterns
    return options
