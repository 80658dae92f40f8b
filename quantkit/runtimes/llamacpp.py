"""The llama.cpp runtime: feeds the baseline's token ids to llama.cpp and reads its logits."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from quantkit.errors import ArtifactError, BackendError

_DAMAGED_HINT = "the file is truncated or damaged: copy it again or re-run quantize"


def check_gguf(path: Path, hint: str = _DAMAGED_HINT) -> None:
    """Refuse a file that is not a whole GGUF: wrong magic, unreadable header or metadata,
    or tensor data that runs past the end of the file (a truncated copy or download)."""
    import gguf

    size = path.stat().st_size
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != b"GGUF":
        raise ArtifactError(f"'{path}' is not a GGUF file (no GGUF magic)", hint)
    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, IndexError, KeyError, OSError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ArtifactError(f"'{path}' is truncated or damaged ({size} bytes): {first}", hint) from None
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > size:
        raise ArtifactError(
            f"'{path}' is truncated: its tensors end at byte {end}, the file has {size}", hint
        )


def gguf_file(path: Path) -> Path:
    """The model file of a GGUF artifact (a .gguf file, or a folder holding model.gguf).

    Not checked here: ``check_gguf`` parses all metadata (seconds for a large vocabulary), so
    the commands that take a GGUF from the user call it once, outside any timed load.
    """
    if path.is_file():
        return path
    candidates = [p for p in sorted(path.glob("*.gguf")) if p.name != "imatrix.gguf"]
    if not candidates:
        raise BackendError(f"no .gguf model file in '{path}'", "was the artifact made by a gguf recipe?")
    return candidates[0]


class LlamaCppRuntime:
    """A GGUF model loaded in-process by llama-cpp-python with logits for every position."""

    name = "llama.cpp"

    def __init__(
        self,
        path: Path,
        device: str,
        trust_remote_code: bool = False,
        context_length: int = 2048,
        threads: int | None = None,
        logits_all: bool = True,
    ) -> None:
        from llama_cpp import Llama, llama_supports_gpu_offload

        from quantkit.progress import native_stderr_captured

        with native_stderr_captured(verbose=False):  # llama.cpp prints its load log natively
            self.model = Llama(
                model_path=str(gguf_file(path)),
                n_ctx=context_length,
                n_batch=context_length,
                n_ubatch=context_length,
                logits_all=logits_all,
                n_threads=threads or os.cpu_count() or 1,
                n_gpu_layers=-1 if device == "cuda" and llama_supports_gpu_offload() else 0,
                verbose=False,
            )

    def log_probs(self, ids: Any) -> Any:
        """Float32 log-softmax over the vocabulary for each position of ``ids`` [B, L]."""
        import numpy as np
        import torch

        rows = []
        for row in ids.tolist():
            self.model.reset()
            self.model.eval(row)
            logits = np.array(self.model.scores[: len(row)], dtype=np.float32)
            rows.append(torch.from_numpy(logits))
        return torch.log_softmax(torch.stack(rows), dim=-1)

    def close(self) -> None:
        self.model.close()
