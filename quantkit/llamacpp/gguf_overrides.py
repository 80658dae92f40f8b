"""Per-tensor GGUF types (llama-quantize's ``--tensor-type``): parsing, and the checks against a
model's tensors that run before anything heavy.

A pattern is a regular expression that llama.cpp ``std::regex_search``es (ECMAScript syntax) in
each tensor's GGUF name; the first matching pattern wins. llama.cpp silently ignores a pattern
that names nothing and silently falls back to another type when a tensor's rows are not whole
blocks of the asked type, so both are refused here, with the names and the types that fit.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from quantkit.errors import RecipeError
from quantkit.llamacpp.gguf_types import (
    BLOCKS,
    DEFAULT_TYPE,
    TENSOR_NEEDS_IMATRIX,
    TENSOR_TYPES,
    fallback,
    fits,
    quantized,
)

if TYPE_CHECKING:
    from pydantic import JsonValue

    from quantkit.llamacpp.gguf_types import Decision, GGUFTensor, Overrides

WHERE = "options.tensor_types"
# Python-only syntax that std::regex (ECMAScript) rejects: (?P<name>...), look-behind, inline
# flags, atomic groups, and Python's \A / \Z anchors
_NOT_ECMASCRIPT = re.compile(r"(?<!\\)\(\?(?![:=!])|\\[AZ]")
_TYPE_HINT = "per-tensor types are ggml's: " + ", ".join(TENSOR_TYPES)
_PATTERN_HINT = (
    r"a pattern is a regular expression searched in llama.cpp's tensor names, e.g. blk\.[0-3]\.ffn_down"
)
_FILE_TYPES = frozenset(DEFAULT_TYPE) - frozenset(TENSOR_TYPES)  # Q4_K_M and the like: options.type
# 32-weight-block types, by bits: what fits rows that k-quants (256-weight blocks) do not
_SMALL_BLOCKS = ("Q4_0", "IQ4_NL", "Q5_0", "Q8_0")


def tensor_type(value: object, where: str) -> object:
    """A ggml type name, case-insensitive (``q8_0``, ``Q4_K``), as its upper-case name."""
    if not isinstance(value, str):
        return value  # pydantic names the wrong kind of value
    name = value.strip().upper()
    if name not in TENSOR_TYPES:
        hint = _TYPE_HINT
        if name in _FILE_TYPES:
            hint = f"{value} is a file type (options.type); {_TYPE_HINT}"
        raise RecipeError(f"unknown tensor type '{value}' in {where}", hint)
    return name


def tensor_types(value: object) -> object:
    """``options.tensor_types`` as an ordered pattern -> type mapping: a mapping, or a list of
    llama-quantize's ``PATTERN=TYPE`` strings; every pattern compiles, every type exists."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        pairs: list[tuple[object, object]] = []
        for item in value:
            left, sep, right = item.partition("=") if isinstance(item, str) else ("", "", "")
            if not sep:
                raise RecipeError(
                    f"bad entry {item!r} in {WHERE}", "write PATTERN=TYPE (e.g. ffn_down=Q8_0) or a mapping"
                )
            pairs.append((left, right))
    elif isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        return value
    out: dict[str, object] = {}
    for key, kind in pairs:
        pattern = str(key)
        if pattern in out:
            raise RecipeError(f"pattern '{pattern}' appears twice in {WHERE}", "keep one entry per pattern")
        check_pattern(pattern)
        out[pattern] = tensor_type(kind, f"{WHERE} (pattern '{pattern}')")
    return out


def check_pattern(pattern: str) -> None:
    """Refuse a pattern that Python's ``re`` or llama.cpp's ``std::regex`` would not compile."""
    if not pattern:
        raise RecipeError(f"empty pattern in {WHERE}", _PATTERN_HINT)
    try:
        re.compile(pattern)
    except re.error as err:
        raise RecipeError(
            f"invalid regular expression '{pattern}' in {WHERE}: {err}", _PATTERN_HINT
        ) from None
    if _NOT_ECMASCRIPT.search(pattern):
        raise RecipeError(
            f"'{pattern}' in {WHERE} uses Python-only regex syntax that llama.cpp's std::regex rejects",
            "use ECMAScript syntax: no (?P<name>...), look-behind, inline flags or \\A / \\Z",
        )


def check_overrides(tensors: list[GGUFTensor], overrides: Overrides, imatrix: bool) -> None:
    """Refuse overrides that would name no tensor of this model, lose to an earlier pattern
    everywhere, need an importance matrix that is not computed, or not fit a tensor's rows."""
    from quantkit.llamacpp.gguf_types import override_decisions

    decisions = override_decisions(tensors, overrides)
    for pattern, _kind in overrides.tensor_types:
        if not any(decision.source == pattern for decision in decisions.values()):
            _unused_pattern(tensors, pattern, decisions)
    for option, kind in (
        ("output_tensor_type", overrides.output),
        ("token_embedding_type", overrides.token_embedding),
    ):
        if kind is not None and not any(decision.source == option for decision in decisions.values()):
            raise RecipeError(
                f"options.{option} applies to no tensor of this model",
                "a tied output.weight is token_embd.weight, which options.token_embedding_type "
                "or a tensor_types pattern takes first; remove one of them",
            )
    for name, decision in decisions.items():
        exempt = name in ("token_embd.weight", "output.weight")  # llama.cpp's own exemption
        if decision.type in TENSOR_NEEDS_IMATRIX and not exempt and not imatrix:
            raise RecipeError(
                f"{_label(decision)} asks {decision.type} for {name}, which llama.cpp quantizes only "
                "with an importance matrix",
                "set options.imatrix=true (computed from the calibration set) or pick another type",
            )
    widths = {tensor.name: tensor.ne[0] for tensor in tensors}
    misfits = [
        (name, decision) for name, decision in decisions.items() if not fits(widths[name], decision.type)
    ]
    if misfits:
        name, decision = misfits[0]
        others = sum(1 for _, other in misfits[1:] if other.source == decision.source)
        _misfit(name, widths[name], decision, others)


def summary(tensors: list[GGUFTensor], overrides: Overrides, written: Mapping[str, str]) -> list[JsonValue]:
    """Each override with the tensors it took and the types llama.cpp wrote for them."""
    from quantkit.llamacpp.gguf_types import override_decisions

    decisions = override_decisions(tensors, overrides)
    entries: list[tuple[str, str | None, str]] = [
        ("tensor_types", pattern, kind) for pattern, kind in overrides.tensor_types
    ]
    if overrides.output is not None:
        entries.append(("output_tensor_type", None, overrides.output))
    if overrides.token_embedding is not None:
        entries.append(("token_embedding_type", None, overrides.token_embedding))
    out: list[JsonValue] = []
    for option, pattern, kind in entries:
        source = pattern if pattern is not None else option
        names = [name for name, decision in decisions.items() if decision.source == source]
        histogram: dict[str, JsonValue] = dict(sorted(Counter(written[name] for name in names).items()))
        entry: dict[str, JsonValue] = {"option": option}
        if pattern is not None:
            entry["pattern"] = pattern
        entry |= {"type": kind, "tensors": list(names), "written": histogram}
        out.append(entry)
    return out


def _label(decision: Decision) -> str:
    if decision.source in ("output_tensor_type", "token_embedding_type"):
        return f"options.{decision.source}"
    return f"{WHERE} '{decision.source}'"


def _unused_pattern(tensors: list[GGUFTensor], pattern: str, decisions: Mapping[str, Decision]) -> None:
    regex = re.compile(pattern)
    named = [tensor for tensor in tensors if regex.search(tensor.name)]
    taken = [tensor.name for tensor in named if tensor.name in decisions]
    if taken:
        first = decisions[taken[0]]
        raise RecipeError(
            f"{WHERE} '{pattern}' sets no tensor: {taken[0]} and the others it names are taken "
            f"by {_label(first)}",
            "the first matching pattern wins (as in llama-quantize): put the narrower pattern first",
        )
    if named:
        raise RecipeError(
            f"{WHERE} '{pattern}' names only tensors llama.cpp keeps unquantized ({named[0].name})",
            f"name quantized tensors, e.g. {_examples(tensors)}",
        )
    raise RecipeError(
        f"{WHERE} '{pattern}' names no tensor of this model",
        f"tensor names look like {_examples(tensors)} (GGUF names, lower case)",
    )


def _examples(tensors: list[GGUFTensor]) -> str:
    """A few quantized tensor names: the ones outside the layers and layer 0's, with the layer range."""
    names = [
        t.name
        for t in tensors
        if quantized(t) and (t.name.startswith("blk.0.") or not t.name.startswith("blk."))
    ]
    layers = sorted({int(t.name.split(".")[1]) for t in tensors if re.match(r"blk\.\d+\.", t.name)})
    shown = ", ".join(names[:10])
    return f"{shown} (blk.{layers[0]} to blk.{layers[-1]})" if layers else shown


def _misfit(name: str, width: int, decision: Decision, others: int) -> None:
    block = BLOCKS[decision.type][0]
    more = f" (and {others} more)" if others else ""
    fitting = [kind for kind in _SMALL_BLOCKS if fits(width, kind)] or ["F16"]
    own = fallback(width, decision.type)
    hint = f"use {own} (what llama.cpp would silently write instead)"
    rest = [kind for kind in fitting if kind != own]
    if rest:
        hint += f" or another type that fits {width}-wide rows: {', '.join(rest)}"
    raise RecipeError(
        f"{_label(decision)} asks {decision.type} for {name}{more}, whose {width}-wide rows are not "
        f"whole {block}-weight blocks",
        hint,
    )


_FILE_TYPES = frozenset(
    {
        "Q5_K_M",
        "Q5_K_S",
        "Q4_K_M",
        "Q4_K_S",
        "Q3_K_L",
        "Q3_K_M",
        "Q3_K_S",
        "IQ3_M",
        "IQ3_XS",
        "IQ2_M",
        "Q2_K_S",
    }
)
