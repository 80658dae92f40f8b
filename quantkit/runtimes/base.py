"""The Runtime protocol: how a model (baseline or artifact) is loaded, scored, timed and closed.

The scoring contract is one a top-k-only runtime can meet (vLLM's prompt log-probs, an
OpenAI-compatible endpoint): per predicted position the runtime returns the log-prob of the
actual next token and its own ``top_k`` most likely tokens with their log-probs. A runtime
that holds the full distribution (transformers, llama.cpp) sets ``scores_any_token`` and
also returns the log-probs of ids it is asked about (the reference's top-k and its tail
sample), from which quantkit computes the KLD within ~1 % of the full-vocabulary value; it can
also draw the tail sample itself (``tail_samples``, for the baseline reference). A top-k-only
runtime's log-probs for the reference's ids are estimated from its own top-k and its KLD is
the top-k + rest lower bound (``quantkit.evals.quality``; docs/evaluation.md states both
estimators and their error).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol, TypeAlias

if TYPE_CHECKING:
    from collections.abc import Iterable

    import numpy as np
    import numpy.typing as npt
    import torch
    from typing_extensions import Self

    from quantkit.device import BaselineDtype
    from quantkit.jsontypes import JsonDict

# The arrays of the scoring contract. Token ids quantkit sends are int64. What a runtime returns
# is float32 log-probs and int32 ids from the in-process ones (torch), float64 and int64 from an
# endpoint's JSON; readers convert (``astype``) before they compute.
TokenIds: TypeAlias = "npt.NDArray[np.int64]"
LogProbs: TypeAlias = "npt.NDArray[np.float32] | npt.NDArray[np.float64]"
Ids: TypeAlias = "npt.NDArray[np.int32] | npt.NDArray[np.int64]"


@dataclass(frozen=True)
class RuntimeSettings:
    """How to load a model: device, precision, context, threads, and whether it is for scoring
    (all positions' logits kept) or for generation only (benchmarks)."""

    device: str
    context_length: int = 2048
    threads: int | None = None
    trust_remote_code: bool = False
    scoring: bool = True
    dtype: BaselineDtype | None = None  # transformers' compute precision (None: the device's baseline one)

    @property
    def compute_dtype(self) -> BaselineDtype:
        """``dtype``, or the baseline precision of ``device`` when unset."""
        from quantkit.device import baseline_dtype

        return self.dtype or baseline_dtype(self.device)


@dataclass(frozen=True)
class ScoreRequest:
    """Token windows to score: ``ids`` [B, L]; predictions are for positions 1..L-1."""

    ids: TokenIds
    top_k: int = 1
    reference_ids: TokenIds | None = None  # [B, L-1, k]; only for runtimes with scores_any_token
    # Also draw this many ids per position from the distribution outside the own top-k
    # (systematic sampling, seeded): the baseline reference's tail sample. Full-distribution
    # runtimes only.
    tail_samples: int = 0
    seed: int = 0


@dataclass
class Scores:
    """Per window and predicted position (``L - 1`` of them)."""

    target_logprobs: LogProbs  # [B, L-1]: log q(actual next token)
    topk_ids: Ids  # [B, L-1, k]: the runtime's own most likely ids, descending
    topk_logprobs: LogProbs  # [B, L-1, k]
    rest_logmass: LogProbs | None = None  # [B, L-1]: log(1 - Σ top-k q), when known
    reference_logprobs: LogProbs | None = None  # [B, L-1, k_ref]: log q of the asked ids
    reference_rest_logmass: LogProbs | None = None  # [B, L-1]: log(1 - Σ q of asked ids)
    tail_ids: Ids | None = None  # [B, L-1, m]: ids drawn ∝ q outside the own top-k
    tail_logprobs: LogProbs | None = None  # [B, L-1, m]: their log q

    def residual_logmass(self) -> npt.NDArray[np.float64]:
        """log of the probability outside the own top-k: exact when the runtime gave it,
        else ``log(1 - Σ top-k q)`` (floored at 1e-30)."""
        import numpy as np

        if self.rest_logmass is not None:
            return self.rest_logmass.astype(np.float64)
        mass = np.exp(self.topk_logprobs.astype(np.float64)).sum(-1)
        return np.log(np.clip(1.0 - mass, 1e-30, None))


@dataclass(frozen=True)
class Generation:
    """One timed greedy generation: seconds to the first token and in total."""

    first_token_s: float
    total_s: float


@dataclass(frozen=True)
class DeviceMemory:
    """Accelerator memory of this process (CUDA): allocated now, and the peaks so far."""

    allocated_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int


LmEvalModel: TypeAlias = "tuple[str | object, JsonDict | None]"
"""What ``lm_eval.simple_evaluate`` takes: a registered model name with its ``model_args``, or
an ``lm_eval.api.model.LM`` instance (then ``None``)."""


class OwnTokenizer(Protocol):
    """A file's own tokenizer, as its runtime cuts text (a GGUF's ``tokenizer.ggml.*`` in
    llama.cpp); ``Runtime.own_tokenizer`` opens it, ``quantkit.inputs.tokenizer_check`` compares it."""

    @property
    def bos_token_id(self) -> int | None: ...

    @property
    def adds_bos(self) -> bool:
        """Whether the file leads a text with BOS (llama-perplexity and servers follow it)."""
        ...

    def tokenize(self, data: bytes, special: bool) -> list[int]:
        """Ids of ``data`` without BOS; ``special``: special-token strings count as those tokens."""
        ...

    def detokenize(self, ids: list[int]) -> bytes:
        """The pieces of ``ids`` joined, as the file spells each one."""
        ...

    def text(self, ids: list[int]) -> bytes:
        """The text ``ids`` encode, to be cut again: ``detokenize`` without the leading space
        the tokenizer itself adds to a text (SentencePiece's dummy prefix)."""
        ...

    def close(self) -> None: ...


class Runtime(Protocol):
    """A loaded model. Implementations register in ``quantkit.runtimes.RUNTIMES``."""

    name: ClassVar[str]  # shown in reports, e.g. "transformers"
    scores_any_token: ClassVar[bool]  # can return log-probs of arbitrary ids (full distribution)
    batched_generation: ClassVar[bool]  # generate() takes several prompts at once
    libraries: ClassVar[tuple[str, ...]]  # modules it imports to run (benchmarks import them first)

    @classmethod
    def load(cls, path: Path, settings: RuntimeSettings) -> Self:
        """Load the model at ``path`` (a folder, or a file for single-file formats)."""
        ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def bos_token_id(self) -> int | None: ...

    @property
    def adds_bos(self) -> bool:
        """Whether the model's tokenizer leads a text with ``bos_token_id`` (the BOS rule of
        ``quantkit.inputs.special_tokens``; lm-eval contexts follow it)."""
        ...

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens (lm-eval requests)."""
        ...

    def score(self, request: ScoreRequest) -> Scores: ...

    def generate(self, prompts: list[list[int]], new_tokens: int) -> Generation:
        """Greedy decoding with the KV cache, timed: the first token, then ``new_tokens - 1``."""
        ...

    def device_memory(self) -> DeviceMemory | None:
        """Peak accelerator memory so far, when the runtime can tell (None on the CPU)."""
        ...

    def close(self) -> None: ...

    @classmethod
    def lm_eval_model(cls, path: Path, settings: RuntimeSettings) -> LmEvalModel:
        """How lm-eval runs this model (``quantkit.evals.lm_eval_runtime.RuntimeLM`` serves
        any runtime that scores)."""
        ...

    @classmethod
    def check_artifact(cls, path: Path) -> None:
        """Refuse an artifact at ``path`` this runtime would fail on mid-way (a truncated
        file), before any work; nothing by default (transformers reports its own errors)."""
        return None

    @classmethod
    def own_tokenizer(cls, path: Path) -> OwnTokenizer | None:
        """The tokenizer the file at ``path`` carries and its users cut text with, when it is
        its own (a GGUF's vocabulary); None when the runtime reads the baseline's tokenizer
        files (transformers: an artifact folder holds the source's tokenizer, copied)."""
        return None


RuntimeClass: TypeAlias = "type[Runtime]"


_CHUNK_ELEMENTS = 1 << 24  # a full-vocabulary temporary per chunk of positions: ~64 MB of float32


def scores_from_log_probs(log_probs: torch.Tensor, request: ScoreRequest) -> Scores:
    """Scores from full-vocabulary log-probs ``[B, L, V]``, for the runtimes that hold the
    whole distribution. Residual masses are exact (logsumexp of the rest)."""
    return scores_from_logits(iter(log_probs), request, normalized=True)


def scores_from_logits(
    rows: Iterable[torch.Tensor], request: ScoreRequest, normalized: bool = False
) -> Scores:
    """Scores from each window's full-vocabulary logits ``[L, V]``, in order (log-probs when
    ``normalized``). Windows and positions are taken a chunk at a time, so no temporary the
    size of a whole batch's distribution exists (Gemma 3's 262k vocabulary: 2.1 GB per
    4 x 512 tokens); the tail samples are drawn in the same order as ``sample_tail``'s."""
    import torch

    ids = torch.as_tensor(request.ids, dtype=torch.long)
    asked_all = (
        None if request.reference_ids is None else torch.as_tensor(request.reference_ids, dtype=torch.long)
    )
    generator = torch.Generator().manual_seed(request.seed)
    parts: dict[str, list[torch.Tensor]] = {}
    for index, logits in enumerate(rows):
        chunk = max(1, _CHUNK_ELEMENTS // logits.shape[-1])
        for start in range(0, logits.shape[0] - 1, chunk):
            stop = min(start + chunk, logits.shape[0] - 1)
            lp = logits[start:stop].float()
            if not normalized:
                lp = torch.log_softmax(lp, dim=-1)
            asked = None if asked_all is None else asked_all[index, start:stop]
            for key, value in _chunk_scores(lp, ids[index, start + 1 : stop + 1], asked, request, generator):
                parts.setdefault(key, []).append(value)

    def joined(key: str) -> torch.Tensor:
        per_row: list[torch.Tensor] = parts[key]
        return torch.cat(per_row).reshape(len(ids), -1, *per_row[0].shape[1:])

    def floats(key: str) -> npt.NDArray[np.float32]:  # every log-prob part is float32
        return joined(key).numpy()

    def ints(key: str) -> npt.NDArray[np.int32]:  # ids are cast to int32 in _chunk_scores
        return joined(key).numpy()

    scores = Scores(
        target_logprobs=floats("target"),
        topk_ids=ints("topk_ids"),
        topk_logprobs=floats("topk"),
        rest_logmass=floats("rest"),
    )
    if asked_all is not None:
        scores.reference_logprobs = floats("asked")
        scores.reference_rest_logmass = floats("asked_rest")
    if request.tail_samples:
        scores.tail_ids = ints("tail_ids")
        scores.tail_logprobs = floats("tail")
    return scores


def _chunk_scores(
    lp: torch.Tensor,
    targets: torch.Tensor,
    asked: torch.Tensor | None,
    request: ScoreRequest,
    generator: torch.Generator,
) -> list[tuple[str, torch.Tensor]]:
    """The score parts of ``lp`` ``[n, V]`` (n consecutive positions of one window)."""
    import torch

    values, indices = lp.topk(request.top_k, dim=-1)
    if request.top_k == 1:
        rest = torch.log1p(-values[..., 0].exp().clamp(max=1.0 - 1e-7))
    else:
        rest = torch.logsumexp(lp.scatter(-1, indices, float("-inf")), dim=-1)
    out = [
        ("target", lp.gather(-1, targets[:, None]).squeeze(-1)),
        ("topk_ids", indices.to(torch.int32)),
        ("topk", values),
        ("rest", rest),
    ]
    if asked is not None:
        picked = lp.gather(-1, asked)
        out += [("asked", picked), ("asked_rest", log_mass_outside(picked, asked))]
    if request.tail_samples:
        tail = _sample_chunk(lp, indices, request.tail_samples, generator)
        out += [("tail_ids", tail.to(torch.int32)), ("tail", lp.gather(-1, tail))]
    return out


def log_mass_outside(log_probs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """log(1 - Σ p) over the distinct ``ids`` of each position, from their gathered
    ``log_probs`` ``[..., m]`` (float64 sum, so no ``[B, L, V]`` copy of the distribution:
    the vocabulary-wide scatter + logsumexp it replaces cost more than the forward pass's
    log-softmax). Returns float32 ``[...]``; log(1e-30) where the ids hold all the mass."""
    import torch

    sorted_ids, order = ids.sort(dim=-1)
    p = log_probs.double().exp().gather(-1, order)
    first = torch.ones_like(sorted_ids, dtype=torch.bool)
    first[..., 1:] = sorted_ids[..., 1:] != sorted_ids[..., :-1]
    mass = (p * first).sum(-1)
    return torch.log((1.0 - mass).clamp(min=1e-30)).float()


def sample_tail(log_probs: torch.Tensor, top_ids: torch.Tensor, samples: int, seed: int) -> torch.Tensor:
    """``samples`` ids per position drawn from the distribution outside ``top_ids``
    (renormalized), by systematic sampling: one uniform offset per position, then evenly spaced
    points on the tail's cumulative distribution. Each draw is marginally distributed as the
    tail, so a mean over the draws is an unbiased estimate of a tail expectation, with a lower
    variance than independent draws. Deterministic given ``seed``. Returns int64 ``[B, L-1, m]``."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    chunk = max(1, _CHUNK_ELEMENTS // log_probs.shape[-1])  # positions per float64 CDF (~128 MB)
    rows = []
    for row, top in zip(log_probs, top_ids, strict=True):
        picked = [
            _sample_chunk(row[start : start + chunk], top[start : start + chunk], samples, generator)
            for start in range(0, row.shape[0], chunk)
        ]
        rows.append(torch.cat(picked))
    return torch.stack(rows)


def _sample_chunk(
    lp: torch.Tensor, top: torch.Tensor, samples: int, generator: torch.Generator
) -> torch.Tensor:
    """``sample_tail`` for ``n`` positions ``[n, V]`` of one window, drawing from ``generator``."""
    import torch

    steps = torch.arange(samples, dtype=torch.float64)
    cdf = lp.double().exp().scatter(-1, top.long(), 0.0).cumsum(-1)
    offset = torch.rand(cdf.shape[0], 1, generator=generator, dtype=torch.float64)
    points = (steps + offset) / samples * cdf[:, -1:]
    return torch.searchsorted(cdf, points).clamp(max=cdf.shape[-1] - 1)
