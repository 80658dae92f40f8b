"""llama.cpp's own server (``quantkit serve --server llama-server --parallel 4``) on the real
SmolLM2 Q4_K_M: four parallel slots decode together, so throughput at concurrency 4 is higher
than at 1 (llama-cpp-python's server, one request at a time, cannot do that:
test_serving_smollm2.py asserts its queueing instead). Behind ``make serve-batching`` (the
``llama_server`` marker, not part of ``make test``): it builds ``llama-server`` from the
bindings' sdist once (minutes) and passes it in ``QUANTKIT_LLAMA_SERVER``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require_extra
from servers import wait_until_answering

from quantkit.cli import main

require_extra("openai", "serve")
require_extra("llama_cpp", "gguf")

pytestmark = [pytest.mark.slow, pytest.mark.llama_server]

BUDGET = ["--set", "eval.num_windows=2", "--set", "eval.seq_len=128", "--device", "cpu", "--no-bench"]
LOAD = ["--requests", "16", "--max-tokens", "32", "--prompt-lengths", "32,64", "--timeout", "60s"]


@pytest.fixture(scope="module")
def run(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("llama-server") / "q4"
    assert main(["quantize", "gguf-q4_k_m", *BUDGET, "--out", str(folder)]) == 0
    return folder


@pytest.fixture(scope="module")
def served(run: Path) -> Iterator[str]:
    binary = os.environ.get("QUANTKIT_LLAMA_SERVER")
    assert binary and Path(binary).is_file(), (
        "make serve-batching builds llama-server and sets QUANTKIT_LLAMA_SERVER"
    )
    command = [sys.executable, "-m", "quantkit", "serve", str(run), "--server", "llama-server"]
    process = subprocess.Popen(
        [*command, "--parallel", "4", "--threads", "1", "--context-length", "512"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1"), process.stderr.read()  # type: ignore[union-attr]
        wait_until_answering(url, process)  # type: ignore[arg-type]
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0


def test_four_parallel_slots_give_more_throughput_than_one(
    run: Path, served: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", str(run), "--endpoint", served, "--concurrency", "1,4", *LOAD]) == 0
    capsys.readouterr()
    side = json.loads((run / "manifest.json").read_text())["serve"]["artifact"]
    assert side["server"]["model"] == "gguf-q4_k_m" and side["server"]["version"]  # llama.cpp's build info
    one, four = side["levels"]
    for level in (one, four):
        assert (level["requests"], level["completed"], level["failed"]) == (16, 16, 0), level["errors"]
        for name in ("ttft", "tpot", "itl", "e2e"):
            assert 0 < level[name]["p50"] <= level[name]["p95"] <= level[name]["p99"], name
    ratio = four["output_tok_s"] / one["output_tok_s"]
    print(
        f"llama-server -np 4: output {one['output_tok_s']:.1f} tok/s at 1, {four['output_tok_s']:.1f} at 4 "
        f"({ratio:.2f}x); requests {one['request_throughput']:.2f} vs {four['request_throughput']:.2f}/s; "
        f"TPOT p50 {one['tpot']['p50'] * 1e3:.1f} vs {four['tpot']['p50'] * 1e3:.1f} ms"
    )
    assert ratio > 1.3  # batched decode: four sequences per step for little more than one's cost
    assert four["request_throughput"] > 1.3 * one["request_throughput"]


def test_quality_through_llama_server_is_refused_for_want_of_prompt_log_probs(
    run: Path, served: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = json.loads((run / "manifest.json").read_text()).get("served_quality")
    assert main(["eval", str(run), "--endpoint", served, "--top-logprobs", "5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-2] == (
        f"error: the server at {served} returns no prompt log-probs "
        "(neither vLLM's prompt_logprobs nor echo with logprobs)"
    )
    assert "vllm serve" in err[-1]
    assert json.loads((run / "manifest.json").read_text()).get("served_quality") == before
