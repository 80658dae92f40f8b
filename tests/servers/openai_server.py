"""Small OpenAI-compatible servers the serving tests start on loopback (uvicorn, a process
of their own), for what no real server here does:

- ``vllm``: vLLM's scoring protocol (``/v1/completions`` with token-id prompts and
  ``prompt_logprobs``: per position ``{token_id: {logprob, rank, decoded_token}}`` with the
  server's top-k and the prompt's own token, the first position null), computed by llama.cpp
  on a real GGUF. vLLM cannot be installed on these machines; this stands in for its response
  format only, the numbers are llama.cpp's.
- ``error500``: every completion request fails with HTTP 500.
- ``stall``: streams one chunk, then sends nothing more.
- ``cut``: streams a few chunks and ends without a ``finish_reason``.
- ``nologprobs``: completions without any log-probs (echo and prompt_logprobs ignored).
- ``instant``: streams ``max_tokens`` chunks at once (the load generator's own overhead,
  bench/serving_overhead.py).

Every mode counts the connections its completion requests came on (``GET /connections``).

``python tests/servers/openai_server.py MODE PORT [GGUF]``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

MODEL = "test-model"


def app_for(mode: str, gguf: str | None) -> FastAPI:
    app = FastAPI()
    llama = None
    if mode == "vllm":
        import llama_cpp

        llama = llama_cpp.Llama(model_path=gguf, n_ctx=2048, logits_all=True, verbose=False, n_threads=2)

    @app.get("/v1/models")
    async def models() -> dict[str, object]:
        return {"object": "list", "data": [{"id": MODEL, "object": "model", "root": MODEL}]}

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": f"quantkit-test-{mode}"}

    peers: list[str] = []  # the client address:port of every completion request

    @app.get("/connections")
    async def connections() -> dict[str, int]:
        return {"requests": len(peers), "connections": len(set(peers))}

    @app.post("/v1/completions")
    async def completions(request: Request) -> object:
        peers.append(f"{request.client.host}:{request.client.port}" if request.client else "?")
        body = await request.json()
        if mode == "error500":
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        if body.get("stream"):
            return StreamingResponse(
                _stream(mode, int(body.get("max_tokens", 16))), media_type="text/event-stream"
            )
        if mode == "vllm" and body.get("prompt_logprobs") is not None:
            return _prompt_logprobs(llama, body)
        return _plain(body)

    return app


def _chunk(text: str, finish: str | None) -> str:
    data = {
        "id": "cmpl-test",
        "object": "text_completion",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
    }
    return f"data: {json.dumps(data)}\n\n"


async def _stream(mode: str, max_tokens: int):  # type: ignore[no-untyped-def]
    if mode == "stall":
        yield _chunk(" once", None)
        await asyncio.sleep(3600)
        return
    count = max_tokens if mode != "cut" else max(1, max_tokens // 2)
    for index in range(count):
        if mode != "instant":
            await asyncio.sleep(0.002)
        last = index == count - 1 and mode != "cut"
        yield _chunk(" word", "length" if last else None)
    yield "data: [DONE]\n\n"


def _plain(body: dict[str, object]) -> dict[str, object]:
    return {
        "id": "cmpl-test",
        "object": "text_completion",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [{"index": 0, "text": " word", "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def _prompt_logprobs(llama, body: dict[str, object]) -> object:  # type: ignore[no-untyped-def]
    import numpy as np

    prompt = body["prompt"]
    if not isinstance(prompt, list) or not all(isinstance(i, int) for i in prompt):
        return JSONResponse({"error": {"message": "token-id prompts only"}}, status_code=400)
    k = int(body["prompt_logprobs"])  # type: ignore[arg-type]
    llama.reset()
    llama.eval(prompt)
    logits = np.asarray(llama.scores[: len(prompt)], dtype=np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    logprobs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    entries: list[object] = [None]
    for position in range(1, len(prompt)):
        row = logprobs[position - 1]  # the distribution that predicts prompt[position]
        order = np.argsort(-row)
        ranks = {int(token): rank + 1 for rank, token in enumerate(order[:k])}
        wanted = [int(t) for t in order[:k]]
        actual = int(prompt[position])
        if actual not in ranks:
            ranks[actual] = int((row > row[actual]).sum()) + 1
            wanted.append(actual)
        entries.append(
            {str(t): {"logprob": float(row[t]), "rank": ranks[t], "decoded_token": ""} for t in wanted}
        )
    return {
        "id": "cmpl-test",
        "object": "text_completion",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [
            {"index": 0, "text": "", "logprobs": None, "finish_reason": "length", "prompt_logprobs": entries}
        ],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": 1, "total_tokens": len(prompt) + 1},
    }


if __name__ == "__main__":
    mode, port = sys.argv[1], int(sys.argv[2])
    gguf = sys.argv[3] if len(sys.argv) > 3 else None
    uvicorn.run(app_for(mode, gguf), host="127.0.0.1", port=port, log_level="warning")
