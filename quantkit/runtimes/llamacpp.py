"""The llama.cpp runtime: feeds the baseline's token ids to llama.cpp and reads its logits."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from quantkit.device import cpu_threads
from quantkit.errors import ArtifactError, BackendError
from quantkit.runtimes.base import (
    DeviceMemory,
    Generation,
    LmEvalModel,
    Runtime,
    RuntimeSettings,
    ScoreRequest,
    Scores,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    import torch
    from llama_cpp import Llama
    from typing_extensions import Self

    from quantkit.llamacpp.gguf_file import GGUFFile

_DAMAGED_HINT = "the file is truncated or damaged: copy it again or re-run quantize"


def check_gguf(path: Path, hint: str = _DAMAGED_HINT) -> GGUFFile:
    """Refuse a file that is not a whole GGUF: wrong magic, unreadable header or metadata,
    or tensor data that runs past the end of the file (a truncated copy or download). Returns
    the parsed header (read once per file and process)."""
    from quantkit.llamacpp.gguf_file import MAGIC, GGUFFormatError, read_gguf

    size = path.stat().st_size
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != MAGIC:
        raise ArtifactError(f"'{path}' is not a GGUF file (no GGUF magic)", hint)
    try:
        header = read_gguf(path)
    except (GGUFFormatError, OSError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ArtifactError(f"'{path}' is truncated or damaged ({size} bytes): {first}", hint) from None
    if header.data_end > size:
        raise ArtifactError(
            f"'{path}' is truncated: its tensors end at byte {header.data_end}, the file has {size}", hint
        )
    return header


def gguf_file(path: Path) -> Path:
    """The model file of a GGUF artifact (a .gguf file, or a folder holding model.gguf).

    Not checked here: ``check_gguf`` reads the whole header, so the commands that take a GGUF
    from the user call it once, outside any timed load.
    """
    if path.is_file():
        return path
    candidates = [p for p in sorted(path.glob("*.gguf")) if p.name != "imatrix.gguf"]
    if not candidates:
        raise BackendError(f"no .gguf model file in '{path}'", "was the artifact made by a gguf recipe?")
    return candidates[0]


def _bos_token_id(model: Llama) -> int | None:
    token = int(model.token_bos())
    return None if token < 0 else token


def _adds_bos(model: Llama) -> bool:
    """The GGUF's ``tokenizer.ggml.add_bos_token``, for a vocabulary that has a BOS."""
    return _bos_token_id(model) is not None and bool(model._model.add_bos_token())


class LlamaCppRuntime(Runtime):
    """A GGUF model loaded in-process by llama-cpp-python (logits of every position kept for
    scoring; only the last for generation)."""

    name: ClassVar[str] = "llama.cpp"
    scores_any_token: ClassVar[bool] = True
    batched_generation: ClassVar[bool] = False
    libraries: ClassVar[tuple[str, ...]] = ("llama_cpp",)

    def __init__(self, model: Llama, settings: RuntimeSettings) -> None:
        self.model = model
        self.settings = settings

    @classmethod
    def load(cls, path: Path, settings: RuntimeSettings) -> Self:
        from llama_cpp import Llama, llama_supports_gpu_offload

        from quantkit.util.progress import native_stderr_captured

        context = settings.context_length
        with native_stderr_captured(verbose=False):  # llama.cpp prints its load log natively
            model = Llama(
                model_path=str(gguf_file(path)),
                n_ctx=context,
                n_batch=context,
                n_ubatch=context,
                logits_all=settings.scoring,
                n_threads=settings.threads or cpu_threads(),
                n_gpu_layers=-1 if settings.device == "cuda" and llama_supports_gpu_offload() else 0,
                verbose=False,
            )
        return cls(model, settings)

    @property
    def vocab_size(self) -> int:
        return int(self.model.n_vocab())

    @property
    def bos_token_id(self) -> int | None:
        return _bos_token_id(self.model)

    @property
    def adds_bos(self) -> bool:
        """The GGUF's ``tokenizer.ggml.add_bos_token`` (as llama-perplexity reads it)."""
        return _adds_bos(self.model)

    def tokenize(self, text: str) -> list[int]:
        return list(self.model.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def score(self, request: ScoreRequest) -> Scores:
        import numpy as np
        import torch

        from quantkit.runtimes.base import scores_from_logits

        def rows() -> Iterator[torch.Tensor]:  # one window's logits at a time
            for row in request.ids.tolist():
                self.model.reset()
                self.model.eval(row)
                yield torch.from_numpy(np.array(self.model.scores[: len(row)], dtype=np.float32))

        return scores_from_logits(rows(), request)

    def generate(self, prompts: list[list[int]], new_tokens: int) -> Generation:
        import numpy as np

        if len(prompts) != 1:
            raise BackendError("the llama.cpp runtime generates one sequence at a time", "use batch 1")
        llm = self.model
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompts[0])
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        first = time.perf_counter() - start
        for _ in range(new_tokens - 1):
            llm.eval([token])
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        return Generation(first, time.perf_counter() - start)

    def device_memory(self) -> DeviceMemory | None:
        return None  # llama.cpp's CUDA buffers are not visible to torch's allocator

    def close(self) -> None:
        self.model.close()

    @classmethod
    def lm_eval_model(cls, path: Path, settings: RuntimeSettings) -> LmEvalModel:
        """Through ``RuntimeLM`` over this runtime (llama-cpp-python's own lm-eval adapter lacks
        log-probs of the first position and rolling log-likelihood)."""
        from quantkit.evals.lm_eval_runtime import RuntimeLM

        return RuntimeLM(cls.load(path, settings), settings.context_length), None

    @classmethod
    def check_artifact(cls, path: Path) -> None:
        """A whole GGUF (``check_gguf``): a damaged file is the user's to fix."""
        check_gguf(gguf_file(path))

    @classmethod
    def own_tokenizer(cls, path: Path) -> LlamaCppVocabulary:
        """The GGUF's own vocabulary (``tokenizer.ggml.*``), loaded without its weights."""
        return LlamaCppVocabulary.load(gguf_file(path))


class LlamaCppVocabulary:
    """A GGUF's tokenizer as llama.cpp runs it (``vocab_only``: no weights are read)."""

    def __init__(self, model: Llama, space_prefix: bool) -> None:
        self.model = model
        self.space_prefix = space_prefix

    @classmethod
    def load(cls, path: Path) -> LlamaCppVocabulary:
        from llama_cpp import Llama

        from quantkit.llamacpp.gguf_file import read_gguf
        from quantkit.util.progress import native_stderr_captured

        header = read_gguf(path)
        prefix = header.value("tokenizer.ggml.add_space_prefix")  # llama.cpp: on for SPM unless set
        space_prefix = header.value("tokenizer.ggml.model") == "llama" if prefix is None else bool(prefix)
        with native_stderr_captured(verbose=False):
            return cls(Llama(model_path=str(path), vocab_only=True, verbose=False), space_prefix)

    @property
    def bos_token_id(self) -> int | None:
        return _bos_token_id(self.model)

    @property
    def adds_bos(self) -> bool:
        return _adds_bos(self.model)

    def tokenize(self, data: bytes, special: bool) -> list[int]:
        return [int(i) for i in self.model.tokenize(data, add_bos=False, special=special)]

    def detokenize(self, ids: list[int]) -> bytes:
        """Each id's piece as llama.cpp writes it (special tokens as their text), joined; unlike
        llama-cpp-python's own, pieces longer than 32 bytes are whole and no space is dropped."""
        import ctypes

        import llama_cpp

        vocab = self.model._model.vocab
        out = bytearray()
        buffer = ctypes.create_string_buffer(64)
        for token in ids:
            size = llama_cpp.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, True)
            if size < 0:  # too long for the buffer: -size is what it needs
                buffer = ctypes.create_string_buffer(-size)
                size = llama_cpp.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, True)
            out += buffer.raw[:size]
        return bytes(out)

    def text(self, ids: list[int]) -> bytes:
        data = self.detokenize(ids)
        return data[1:] if self.space_prefix and data.startswith(b" ") else data

    def close(self) -> None:
        self.model.close()
