"""Does a file cut text into the baseline tokenizer's ids? The check every GGUF quantkit reads or
writes passes before its scores are reported.

quantkit scores a GGUF by feeding it the baseline tokenizer's ids; its users feed it text, which
the file's own tokenizer (``tokenizer.ggml.*``) cuts. The two agree only when the file's
vocabulary, piece types, scores and flags say what the baseline's tokenizer does: one user-defined
piece written as a normal one (a whitespace run in Gemma 3) and llama.cpp cuts every text with
that run differently, while the scores over quantkit's own ids still look fine. The check
compares ids, not vocabulary strings: the file's own tokenization of the eval text, the
calibration text and ``stress_text`` (whitespace runs, tabs, indented code, digits, emoji, the
chat template's special strings) against the baseline tokenizer's, and the BOS rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quantkit.errors import ArtifactError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from quantkit.runtimes.base import OwnTokenizer

# What tokenizers disagree on first: whitespace runs (user-defined pieces in Gemma 3), tabs,
# indented code, digit runs (SmolLM2 splits digits), punctuation runs, accents, CJK, emoji
# (byte fallback), and markup.
_STRESS = (
    "  two spaces\n\nnewlines\n\n\n\nand four, then\ttabs\t\tand\t\t\t\tmore.\n"
    "def main(argv):\n    if len(argv) > 1:\n        return 42\n\treturn 0\n\n\n"
    "Numbers: 3.14159, 1,000,000 and 2026-12-07 at 16:45; 0x1F600 = 128512.\n"
    "Punctuation!!! ... ??? --- *** ((nested)) [brackets] {braces} <tags> </tags>\n"
    "Accents: naïve café déjà vu, Straße; 日本語のテキスト; русский текст.\n"
    "Emoji: 🙂🚀👍🏽 and 🇩🇪, then symbols ≤ ≥ → ∑ √ ∞.\n"
    "<p>Markup <b>bold</b> &amp; entities</p>\n"
    "      six spaces\n" + " " * 31 + "thirty-one spaces\n" + "\n" * 31 + "end\n"
)


class TokenizerMismatchError(ArtifactError):
    """A file's own tokenizer cuts text into other ids than the baseline's tokenizer (exit 2)."""

    final = True


@dataclass(frozen=True)
class TokenizationCheck:
    """What a passed check compared: tokens per text (the baseline's count) and the BOS rule."""

    texts: dict[str, int]
    bos: int | None


def stress_text(tokenizer: PreTrainedTokenizerBase) -> str:
    """``_STRESS``, then a short conversation in the model's chat template (its special
    strings) when the tokenizer has one."""
    if not getattr(tokenizer, "chat_template", None):
        return _STRESS
    chat = [
        {"role": "user", "content": "Indent this:\n  a\n\tb"},
        {"role": "assistant", "content": "  a\n\n\tb"},
    ]
    from jinja2 import TemplateError

    try:
        rendered = str(tokenizer.apply_chat_template(chat, tokenize=False))
    except (TemplateError, ValueError):  # a template that rejects these roles adds nothing
        return _STRESS
    return _STRESS + rendered


def first_difference(ours: list[int], theirs: list[int]) -> int | None:
    """The first index where two id lists differ (their common length when one is a prefix of
    the other), None when they are equal."""
    if ours == theirs:
        return None
    pairs = enumerate(zip(ours, theirs, strict=False))
    return next((i for i, (a, b) in pairs if a != b), min(len(ours), len(theirs)))


@dataclass(frozen=True)
class IdMismatch:
    """Where a file first cuts one of the texts otherwise than the baseline's tokenizer."""

    text: str  # the text's name
    at: int  # the first differing position
    ours: list[int]  # the baseline tokenizer's ids of the whole text
    theirs: list[int]  # the file's


def compare_ids(
    tokenizer: PreTrainedTokenizerBase, own: OwnTokenizer, texts: dict[str, str]
) -> tuple[dict[str, int], IdMismatch | None]:
    """Each of ``texts`` (name -> text) cut by the baseline ``tokenizer`` and by ``own``, in
    order until the first that differs: the token counts of those that agree, and the mismatch.
    Special-token strings count as those tokens on both sides, as HF tokenizers (which cut the
    windows) parse them; llama-perplexity's plain-text rule would split them."""
    counts: dict[str, int] = {}
    for name, text in texts.items():
        ours = [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]
        theirs = own.tokenize(text.encode("utf-8"), special=True)
        at = first_difference(ours, theirs)
        if at is not None:
            return counts, IdMismatch(name, at, ours, theirs)
        counts[name] = len(ours)
    return counts, None


def file_bos(own: OwnTokenizer) -> int | None:
    """The BOS id the file leads a text with, None when it adds none."""
    return own.bos_token_id if own.adds_bos else None


def check_tokenization(
    tokenizer: PreTrainedTokenizerBase, own: OwnTokenizer, texts: dict[str, str], what: str, hint: str
) -> TokenizationCheck:
    """Refuse ``own`` (the file ``what``) unless it cuts each of ``texts`` (name -> text) into the
    baseline ``tokenizer``'s ids (``compare_ids``) and adds BOS as the baseline does. The
    message names the text, the first differing position and the pieces on both sides."""
    from quantkit.inputs.special_tokens import tokenizer_bos

    counts, mismatch = compare_ids(tokenizer, own, texts)
    if mismatch is not None:
        at, ours, theirs = mismatch.at, mismatch.ours, mismatch.theirs
        raise TokenizerMismatchError(
            f"{what} tokenizes the {mismatch.text} text differently from the baseline's tokenizer at token "
            f"{at}: {_pieces(own, theirs[at : at + 4])} there, {_pieces(own, ours[at : at + 4])} in the "
            f"baseline ({len(theirs)} vs {len(ours)} tokens)",
            hint,
        )
    expected, theirs_bos = tokenizer_bos(tokenizer), file_bos(own)
    if theirs_bos != expected:
        raise TokenizerMismatchError(
            f"{what} leads a text with BOS {theirs_bos}, the baseline's tokenizer with {expected}", hint
        )
    return TokenizationCheck(texts=counts, bos=expected)


def _pieces(own: OwnTokenizer, ids: list[int]) -> str:
    """The pieces of ``ids`` as the file decodes them, e.g. ``['  ', 'two']``."""
    return repr([own.detokenize([token]).decode("utf-8", errors="replace") for token in ids])


# In the key of every cached F16 GGUF: files converted before the check (and before the
# conversion declared user-defined pieces) are never reused.
TOKENIZER_CHECK_VERSION = 1

CONVERTED_HINT = (
    "llama.cpp's converter did not carry this model's tokenizer into the GGUF, so the file would "
    "score text differently from the model: report this, with the model's tokenizer files"
)


def check_converted_tokenizer(model_dir: Path, gguf_path: Path) -> TokenizationCheck:
    """The GGUF llama.cpp's converter wrote from the HF folder ``model_dir``, checked against
    the folder's own tokenizer on the built-in calibration and eval texts and ``stress_text``."""
    from transformers import AutoTokenizer

    from quantkit.inputs.calibration import builtin_texts
    from quantkit.runtimes.llamacpp import LlamaCppVocabulary

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    own = LlamaCppVocabulary.load(gguf_path)
    try:
        texts = builtin_texts() | {"stress": stress_text(tokenizer)}
        return check_tokenization(tokenizer, own, texts, "the converted GGUF", CONVERTED_HINT)
    finally:
        own.close()
