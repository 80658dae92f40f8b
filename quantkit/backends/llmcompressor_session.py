"""llm-compressor's global session, released when a quantization is done with it."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def released_session() -> Iterator[None]:
    """Reset llm-compressor's global session on the way out, whether the quantization succeeded
    or failed, and collect the model's reference cycles (compressed-tensors wraps its
    ``save_pretrained`` in a closure over the model). ``oneshot`` leaves the model it
    quantized in ``active_session().state``: without this the whole quantization model stayed
    in memory through the evaluation, beside the artifact."""
    try:
        yield
    finally:
        try:
            from llmcompressor.core import reset_session
        except ImportError:  # never imported: nothing to release
            pass
        else:
            reset_session()
        gc.collect()
