"""Scoring token windows through an endpoint's prompt log-probs: ppl, KLD and top-1 of the model
*as served*, against the cached reference, never a silently wrong number.

Two protocols, tried in this order:

- vLLM's ``prompt_logprobs`` on ``/v1/completions``: the prompt as token ids, per position a
  dict ``{token_id: {logprob, rank, decoded_token}}`` holding the server's top-k and the actual
  token (the first position ``None``);
- the OpenAI legacy ``echo`` + ``logprobs``: per echoed token its log-prob and a dict of the
  top-k keyed by token *text*, mapped back to ids through the tokenizer (text that several
  ids decode to is left out: its mass counts as the rest).

A runtime that returns only its own top-k gets the top-k + rest KLD estimator (a lower bound;
docs/evaluation.md). Before any number is kept, the first batch is checked against the
reference: the served top-1 ids must agree with the baseline's at the same position far more
than one position over. A server whose log-probs line up one position late (llama-cpp-python's
echo scores token i with the distribution that predicts token i + 1), or early, or nowhere
(another model), or that returns no prompt log-probs at all, is refused with what it did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal, TypeAlias

from quantkit.errors import UserInputError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from openai import OpenAI
    from transformers import PreTrainedTokenizerBase

    from quantkit.evals.reference import Reference
    from quantkit.runtimes.base import Ids, ScoreRequest, Scores
    from quantkit.serving.endpoint import Endpoint, ServerInfo

Protocol = Literal["prompt_logprobs", "echo"]
# One window's target log-probs [L-1], top-k ids [L-1, k] and top-k log-probs [L-1, k]
_WindowScores: TypeAlias = "tuple[npt.NDArray[np.float64], npt.NDArray[np.int64], npt.NDArray[np.float64]]"
MIN_AGREEMENT = 0.2  # the served top-1 must match the baseline's this often at its own position
MARGIN = 2.0  # ... and this many times more often than one position over


@dataclass
class Alignment:
    """Top-1 agreement of the served distributions with the reference at offsets -1, 0, +1."""

    early: float
    aligned: float
    late: float

    def verdict(self) -> str | None:
        """None when the log-probs line up; else what the server does."""
        best_other = max(self.early, self.late)
        if self.aligned >= MIN_AGREEMENT and self.aligned >= MARGIN * best_other:
            return None
        figures = (
            f"top-1 agreement with the baseline {100 * self.aligned:.0f} % at the same position, "
            f"{100 * self.late:.0f} % one position later, {100 * self.early:.0f} % one earlier"
        )
        if self.late >= MARGIN * max(self.aligned, self.early) and self.late >= MIN_AGREEMENT:
            return (
                "its prompt log-probs are shifted by one position: token i is scored with the distribution "
                f"that predicts token i + 1 (llama-cpp-python's server does this; {figures})"
            )
        if self.early >= MARGIN * max(self.aligned, self.late) and self.early >= MIN_AGREEMENT:
            return f"its prompt log-probs are shifted one position early ({figures})"
        return (
            f"its prompt log-probs do not line up with the baseline at any offset: another model? ({figures})"
        )


def alignment(served_top1: Ids, reference_top1: Ids) -> Alignment:
    """Agreement of ``served_top1`` [B, T] with ``reference_top1`` [B, T] at offsets -1, 0, +1."""
    import numpy as np

    def agree(shift: int) -> float:
        if shift == 0:
            return float(np.mean(served_top1 == reference_top1))
        if shift > 0:
            return float(np.mean(served_top1[:, :-shift] == reference_top1[:, shift:]))
        return float(np.mean(served_top1[:, -shift:] == reference_top1[:, :shift]))

    return Alignment(early=agree(-1), aligned=agree(0), late=agree(1))


class EndpointScorer:
    """Scores windows through ``endpoint`` (the quality evaluator's runtime interface: its own
    top-k only). ``top_k`` is what it asks the server for (vLLM caps it at ``--max-logprobs``)."""

    name: ClassVar[str] = "endpoint"
    scores_any_token: ClassVar[bool] = False

    def __init__(
        self, endpoint: Endpoint, info: ServerInfo, tokenizer: PreTrainedTokenizerBase, top_k: int
    ) -> None:
        self.endpoint = endpoint
        self.info = info
        self.tokenizer = tokenizer
        self.top_k = top_k
        self.protocol: Protocol | None = None
        self._client: OpenAI | None = None
        self._by_text: dict[str, int] | None = None

    def client(self) -> OpenAI:
        if self._client is None:
            timeout = self.endpoint.timeout()  # checks that openai is installed
            from openai import OpenAI

            self._client = OpenAI(
                base_url=self.endpoint.url, api_key=self.endpoint.api_key, timeout=timeout, max_retries=0
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def score(self, request: ScoreRequest) -> Scores:
        """Each window in one request (the server batches what it batches)."""
        import numpy as np

        from quantkit.runtimes.base import Scores

        rows = [self._window([int(i) for i in window]) for window in request.ids]
        return Scores(
            target_logprobs=np.stack([row[0] for row in rows]),
            topk_ids=np.stack([row[1] for row in rows]),
            topk_logprobs=np.stack([row[2] for row in rows]),
        )

    # -- one window ------------------------------------------------------------------------

    def _window(self, ids: list[int]) -> _WindowScores:
        """(target log-probs [L-1], top-k ids [L-1, k], top-k log-probs [L-1, k])."""
        if self.protocol in (None, "prompt_logprobs"):
            parsed = self._prompt_logprobs(ids)
            if parsed is not None:
                self.protocol = "prompt_logprobs"
                return parsed
            if self.protocol == "prompt_logprobs":
                raise UserInputError(
                    f"the server at {self.info.url} stopped returning prompt_logprobs", "check the server"
                )
        parsed = self._echo(ids)
        if parsed is None:
            raise UserInputError(
                f"the server at {self.info.url} returns no prompt log-probs (neither vLLM's prompt_logprobs "
                "nor echo with logprobs)",
                "quality through an endpoint needs a server that scores the prompt: vLLM does "
                "(vllm serve ... --max-logprobs 32); evaluate GGUFs in process with quantkit eval",
            )
        self.protocol = "echo"
        return parsed

    def _post(self, prompt: list[int] | str, extra: dict[str, object]) -> dict[str, object] | None:
        """The first choice of a completion as a dict, or None when the server refuses the form."""
        import openai

        try:
            response = self.client().completions.create(
                model=self.info.model, prompt=prompt, max_tokens=1, temperature=0.0, extra_body=extra
            )
        except (openai.BadRequestError, openai.UnprocessableEntityError):
            return None
        except openai.InternalServerError as err:
            if self.protocol is None:  # still probing: some servers answer a refused form with 500
                return None
            raise UserInputError(
                f"the server at {self.info.url} answered HTTP {err.status_code} to a scoring request",
                "check its log",
            ) from None
        except openai.APIStatusError as err:
            raise UserInputError(
                f"the server at {self.info.url} answered HTTP {err.status_code} to a scoring request",
                "check its log",
            ) from None
        except openai.APIConnectionError:
            raise UserInputError(
                f"lost the server at {self.info.url} while scoring", "check that it runs"
            ) from None
        if not response.choices:
            return None
        return response.choices[0].model_dump()

    def _prompt_logprobs(self, ids: list[int]) -> _WindowScores | None:
        import numpy as np

        choice = self._post(ids, {"prompt_logprobs": self.top_k})
        entries = None if choice is None else choice.get("prompt_logprobs")
        if not isinstance(entries, list) or len(entries) != len(ids):
            return None
        k = self.top_k
        target = np.empty(len(ids) - 1)
        top_ids = np.zeros((len(ids) - 1, k), dtype=np.int64)
        top_lp = np.full((len(ids) - 1, k), -np.inf)
        for position in range(1, len(ids)):
            entry = entries[position]
            if not isinstance(entry, dict):
                return None
            logprobs = {int(key): float(value["logprob"]) for key, value in entry.items()}
            if ids[position] not in logprobs:
                raise UserInputError(
                    f"the server at {self.info.url} left the prompt's own token out of its prompt_logprobs",
                    "quantkit needs the actual token's log-prob at every position (vLLM returns it)",
                )
            target[position - 1] = logprobs[ids[position]]
            ranked = sorted(logprobs.items(), key=lambda item: -item[1])[:k]
            for column, (token, value) in enumerate(ranked):
                top_ids[position - 1, column], top_lp[position - 1, column] = token, value
        return target, top_ids, top_lp

    def _echo(self, ids: list[int]) -> _WindowScores | None:
        import numpy as np

        echo: dict[str, object] = {"echo": True, "logprobs": self.top_k}
        choice = self._post(ids, echo)
        if choice is None:  # token ids refused: the text, which the server tokenizes itself
            choice = self._post(str(self.tokenizer.decode(ids)), echo)
        logprobs = None if choice is None else choice.get("logprobs")
        if not isinstance(logprobs, dict) or not logprobs.get("token_logprobs"):
            return None
        tokens = list(logprobs.get("tokens") or [])
        values = list(logprobs.get("token_logprobs") or [])
        tops = list(logprobs.get("top_logprobs") or [])
        bos = self.tokenizer.bos_token_id
        body = ids[1:] if bos is not None and ids and ids[0] == bos else ids
        offset = len(ids) - len(body)  # a BOS the server does not echo
        if len(tokens) < len(body) or "".join(tokens[: len(body)]) != self.tokenizer.decode(body):
            raise UserInputError(
                f"the server at {self.info.url} echoed other tokens than the prompt's "
                f"({len(tokens)} for {len(body)})",
                "the server must tokenize as the baseline does (serve the run's own artifact)",
            )
        by_text = self._vocabulary()
        k = self.top_k
        rows = len(ids) - 1
        target = np.full(rows, np.nan)
        top_ids = np.zeros((rows, k), dtype=np.int64)
        top_lp = np.full((rows, k), -np.inf)
        for index in range(len(body)):
            row = index + offset - 1  # the prediction of ids[index + offset]
            if row < 0:
                continue
            value, top = values[index], tops[index] if index < len(tops) else None
            if value is None or not isinstance(top, dict):
                return None
            target[row] = float(value)
            known = [(by_text[text], float(lp)) for text, lp in top.items() if text in by_text]
            for column, (token, lp) in enumerate(sorted(known, key=lambda item: -item[1])[:k]):
                top_ids[row, column], top_lp[row, column] = token, lp
        if np.isnan(target).any():
            return None  # a BOS-less window's first token has no log-prob to echo
        return target, top_ids, top_lp

    def _vocabulary(self) -> dict[str, int]:
        """Token text -> id for the texts exactly one id decodes to."""
        if self._by_text is None:
            seen: dict[str, int] = {}
            doubled: set[str] = set()
            for token in range(len(self.tokenizer)):
                text = str(self.tokenizer.decode([token]))
                if text in seen:
                    doubled.add(text)
                seen[text] = token
            self._by_text = {text: token for text, token in seen.items() if text not in doubled}
        return self._by_text


def check_alignment(scores: Scores, reference: Reference, rows: slice, url: str) -> Alignment:
    """Refuse a server whose log-probs do not line up with the baseline's (see the module)."""
    found = alignment(scores.topk_ids[..., 0], reference.topk_ids[rows][..., 0])
    verdict = found.verdict()
    if verdict is not None:
        raise UserInputError(
            f"the server at {url} cannot be scored: {verdict}",
            "quantkit refuses rather than report a wrong number; vLLM's prompt_logprobs line up "
            "(docs/serving.md)",
        )
    return found
