"""Calibration and evaluation text -> seeded token windows with a content hash."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from quantkit.errors import CalibrationError
from quantkit.inputs.special_tokens import window_bos
from quantkit.inputs.tokens import TokenWindows, hash_ids
from quantkit.paths import builtin_text_dir

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from transformers import PreTrainedTokenizerBase

    from quantkit.inputs.specs import CalibrationSpec, EvalSpec, TextSource
    from quantkit.jsontypes import JsonDict

Role = Literal["calibration", "eval"]
_BUILTIN_FILES = {"calibration": "calib.jsonl", "eval": "eval.jsonl"}


def _read_jsonl(path: Path, text_field: str) -> list[str]:
    texts: list[str] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                raise CalibrationError(
                    f"{path}:{number}: not valid JSON", "one JSON object per line"
                ) from None
            if not isinstance(record, dict) or text_field not in record:
                raise CalibrationError(
                    f"{path}:{number}: no '{text_field}' field",
                    "set calibration.text_field to the field that holds the text",
                )
            texts.append(str(record[text_field]))
    return texts


def _read_local(path: Path, text_field: str) -> list[str]:
    if not path.is_file():
        raise CalibrationError(f"text file '{path}' not found", "give a .txt or .jsonl file")
    try:
        if path.suffix == ".jsonl":
            return _read_jsonl(path, text_field)
        if path.suffix == ".txt":
            return [path.read_text(encoding="utf-8")]
    except UnicodeDecodeError as err:
        raise CalibrationError(
            f"{path}: not valid UTF-8 (byte {err.start})", "re-encode the file as UTF-8"
        ) from None
    except OSError as err:
        raise CalibrationError(f"{path}: cannot read ({err.strerror})", "check the file") from None
    raise CalibrationError(f"{path}: unsupported text file type", "use .txt or .jsonl")


def _read_hf(name: str, src: TextSource) -> list[str]:
    """Texts of an HF dataset (hub name or local builder such as 'json' with data files)."""
    try:
        from datasets import load_dataset
    except ImportError:  # pragma: no cover - datasets is a core dependency
        raise CalibrationError("the 'datasets' library is not installed", "pip install datasets") from None
    try:
        dataset = load_dataset(name, src.subset, split=src.split)
    except (FileNotFoundError, ValueError, ConnectionError, OSError) as err:
        raise CalibrationError(
            f"cannot load dataset '{name}': {str(err).splitlines()[0]}",
            "check the dataset name, subset and split (offline: use a local .jsonl)",
        ) from None
    if src.text_field not in dataset.column_names:
        raise CalibrationError(
            f"dataset '{name}' has no column '{src.text_field}'",
            "columns: " + ", ".join(dataset.column_names),
        )
    return [str(text) for text in dataset[src.text_field]]


def load_texts(src: TextSource, role: Role) -> list[str]:
    """The documents of a text source; the built-in set gives disjoint calibration/eval parts."""
    if src.source == "builtin":
        texts = _read_jsonl(builtin_text_dir() / _BUILTIN_FILES[role], "text")
    elif src.source.startswith("hf:"):
        texts = _read_hf(src.source[3:], src)
    else:
        texts = _read_local(Path(src.source).expanduser(), src.text_field)
    texts = [text for text in texts if text.strip()]
    if not texts:
        raise CalibrationError(f"{role} text '{src.source}' is empty", "give a file with text")
    return texts


def builtin_texts() -> dict[str, str]:
    """The built-in calibration and evaluation text, as the windows are cut from them."""
    from quantkit.inputs.specs import TextSource

    return {role: "\n\n".join(load_texts(TextSource(), role)) for role in ("calibration", "eval")}


def source_digest(src: TextSource, role: Role) -> JsonDict:
    """A description of a text source for the manifest."""
    info: JsonDict = {"source": src.source, "role": role}
    if src.source == "builtin":
        info["file"] = _BUILTIN_FILES[role]
    elif src.source.startswith("hf:"):
        info.update(subset=src.subset, split=src.split, text_field=src.text_field)
    return info


def window_text(
    spec: TextSource, tokenizer: PreTrainedTokenizerBase, role: Role, chat_template: bool = False
) -> str:
    """The one text a role's windows are tokenized from: its documents (each in the model's
    chat template with ``chat_template``) joined by blank lines."""
    texts = load_texts(spec, role)
    if chat_template:
        texts = _as_chat(texts, tokenizer)
    return "\n\n".join(texts)


def _token_stream(text: str, tokenizer: PreTrainedTokenizerBase, bos: int | None) -> npt.NDArray[np.int64]:
    """The text as one stream of ids, led by ``bos`` when set."""
    import numpy as np

    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return np.asarray(([] if bos is None else [bos]) + list(ids), dtype=np.int64)


def _windows(
    stream: npt.NDArray[np.int64], seq_len: int, wanted: int, role: Role, what: str, bos: int | None
) -> npt.NDArray[np.int64]:
    """Consecutive ``seq_len`` slices of ``stream``; with ``bos``, each one's first token is
    replaced by it (llama-perplexity's rule: the targets stay those of the plain slices)."""
    chunks = _chunks(stream, seq_len, wanted, role, what)
    if bos is not None:
        chunks[:, 0] = bos
    return chunks


def _chunks(
    stream: npt.NDArray[np.int64], seq_len: int, wanted: int, role: Role, what: str
) -> npt.NDArray[np.int64]:
    count = len(stream) // seq_len
    if count == 0:
        raise CalibrationError(
            f"{role} text has {len(stream)} tokens, shorter than one window of {seq_len}",
            f"give more text or lower {what}.seq_len",
        )
    if count < wanted:
        raise CalibrationError(
            f"{role} text has {len(stream)} tokens: {count} windows of {seq_len}, {wanted} wanted",
            f"give more text, or lower {what}.seq_len or the number of windows",
        )
    return stream[: count * seq_len].reshape(count, seq_len)


def _as_chat(texts: list[str], tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """Each document as a single user turn rendered with the model's chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise CalibrationError(
            "calibration.chat_template is true but the model's tokenizer has no chat template",
            "set calibration.chat_template=false for base models",
        )
    return [
        str(tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False))
        for text in texts
    ]


def calibration_windows(spec: CalibrationSpec, tokenizer: PreTrainedTokenizerBase) -> TokenWindows:
    """``num_samples`` non-overlapping windows drawn from the calibration text with ``seed``."""
    import numpy as np

    bos = window_bos(tokenizer, spec.add_bos, "calibration")
    text = window_text(spec, tokenizer, "calibration", spec.chat_template)
    stream = _token_stream(text, tokenizer, bos)
    chunks = _windows(stream, spec.seq_len, spec.num_samples, "calibration", "calibration", bos)
    rng = np.random.default_rng(spec.seed)
    picked = np.sort(rng.choice(len(chunks), size=spec.num_samples, replace=False))
    ids = chunks[picked]
    source = source_digest(spec, "calibration") | {
        "seed": spec.seed,
        "chat_template": spec.chat_template,
        "bos": bos,
    }
    return TokenWindows(ids=ids, seq_len=spec.seq_len, hash=hash_ids(ids, bos), source=source)


def eval_windows(spec: EvalSpec, tokenizer: PreTrainedTokenizerBase) -> TokenWindows:
    """``num_windows`` consecutive windows of the evaluation text from ``first_window`` on, each led by the
    model's BOS when its tokenizer adds one (``quantkit.inputs.special_tokens``)."""
    bos = window_bos(tokenizer, spec.add_bos, "eval")
    stream = _token_stream(window_text(spec, tokenizer, "eval"), tokenizer, bos)
    first = spec.first_window
    ids = _windows(stream, spec.seq_len, first + spec.num_windows, "eval", "eval", bos)
    ids = ids[first : first + spec.num_windows]
    source = source_digest(spec, "eval") | {"bos": bos}
    return TokenWindows(ids=ids, seq_len=spec.seq_len, hash=hash_ids(ids, bos), source=source)
