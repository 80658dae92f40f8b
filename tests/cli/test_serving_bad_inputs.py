"""Bad endpoints and bad flags: one error line with a hint and exit 2, nothing stored; a gate
never passes on a failed request or a missing serving metric. The misbehaving servers are
tests/servers/openai_server.py's (loopback, started and stopped here)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import require_extra
from servers import free_port, start_server

from quantkit.cli import main

require_extra("openai", "serve")
require_extra("fastapi", "serve")

LOAD = ["--concurrency", "2", "--requests", "2", "--max-tokens", "4", "--prompt-lengths", "16"]


def run_cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    code = main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error(err: str) -> tuple[str, str]:
    """The error and hint lines, the last two of stderr (after any progress), no traceback."""
    lines = err.strip().splitlines()
    assert "Traceback" not in err and sum(line.startswith("error: ") for line in lines) == 1, err
    assert lines[-2].startswith("error: ") and lines[-1].startswith("hint: "), err
    return lines[-2], lines[-1]


@pytest.fixture(scope="module")
def run(tiny_model: Path, session_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run (FP8 on the tiny model) to store measurements in."""
    import os

    os.environ["QUANTKIT_CACHE"] = str(session_cache)
    from conftest import write_tiny_recipe

    folder = tmp_path_factory.mktemp("serving-run")
    recipe = write_tiny_recipe(folder, tiny_model)
    assert main(["quantize", str(recipe), "--out", str(folder / "run")]) == 0
    return folder / "run"


@pytest.mark.parametrize(
    ("mode", "extra", "message"),
    [
        ("error500", [], "failed: HTTP 500 (x4)"),
        ("stall", ["--timeout", "1s"], "failed: timed out (no data for 1 s) (x4)"),
        ("cut", [], "failed: stream ended without a finish_reason (cut off by the server) (x4)"),
    ],
)
def test_a_server_whose_every_request_fails_is_refused_and_nothing_is_stored(
    mode: str, extra: list[str], message: str, run: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    before = (copy / "manifest.json").read_bytes()
    with start_server(mode) as url:
        code, _, err = run_cli(
            capsys, "bench", copy, "--endpoint", url, *LOAD, "--concurrency", "1,2", *extra
        )
    assert code == 2
    first, hint = one_error(err)
    assert first == f"error: every request to {url} failed: {message.split('failed: ')[1]}"
    assert "--timeout" in hint
    assert (copy / "manifest.json").read_bytes() == before


def test_unreachable_url_and_wrong_model_name(
    run: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    closed = f"http://127.0.0.1:{free_port()}/v1"
    code, _, err = run_cli(capsys, "bench", "--endpoint", closed, "--tokenizer", tiny_model, *LOAD)
    assert code == 2
    first, hint = one_error(err)
    assert first == f"error: no server answers at {closed} (connection refused)"
    assert "quantkit serve" in hint and "/v1" in hint
    with start_server("cut") as url:
        code, _, err = run_cli(capsys, "bench", run, "--endpoint", url, "--served-model", "llama3-8b", *LOAD)
        assert code == 2
        first, hint = one_error(err)
        assert first == f"error: the server at {url} serves no model 'llama3-8b' (it serves: test-model)"
        assert hint == "hint: --served-model test-model"
        root = url[: -len("/v1")]
        code, _, err = run_cli(capsys, "bench", run, "--endpoint", root, *LOAD)
        assert code == 2
        first, hint = one_error(err)
        assert (
            first == f"error: {root}/models is not found (404): '{root}' is not an OpenAI-compatible base URL"
        )
        assert "/v1" in hint


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--concurrency", "0,4"], "--concurrency: '0,4' needs positive integers"),
        (["--slo", "latency=1s"], "--slo: 'latency=1s' is not KEY=DURATION"),
        (["--timeout", "soon"], "--timeout: 'soon' is not a duration"),
        (["--side", "middle"], "--side: 'middle' is not artifact or baseline"),
        (["--requests", "0"], "--requests: Input should be greater than or equal to 1"),
        (["--price-per-hour", "-2"], "--price-per-hour must be positive"),
    ],
)
def test_bad_flags_are_refused_before_any_request(
    flags: list[str], message: str, run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    closed = f"http://127.0.0.1:{free_port()}/v1"  # never reached: the flags are checked first
    code, _, err = run_cli(capsys, "bench", run, "--endpoint", closed, *LOAD, *flags)
    assert code == 2
    first, _ = one_error(err)
    assert first.startswith(f"error: {message}"), first
    code, _, err = run_cli(capsys, "bench", run, "--endpoint", "ftp://example/v1")
    assert code == 2 and one_error(err)[0] == "error: 'ftp://example/v1' is not an http(s) URL"
    code, _, err = run_cli(capsys, "bench")
    assert code == 2 and one_error(err)[0] == "error: give RUN folders to benchmark, or --endpoint URL"


def test_a_server_without_prompt_log_probs_is_refused_for_quality(
    run: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    with start_server("nologprobs") as url:
        code, _, err = run_cli(capsys, "eval", copy, "--endpoint", url)
    assert code == 2
    first, hint = one_error(err)
    assert first == (
        f"error: the server at {url} returns no prompt log-probs (neither vLLM's prompt_logprobs nor echo "
        "with logprobs)"
    )
    assert "vllm serve" in hint
    assert json.loads((copy / "manifest.json").read_text()).get("served_quality") is None


def test_the_gate_fails_on_missing_serving_metrics_and_on_failed_requests(
    run: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = run_cli(capsys, "gate", run, "--max-ttft-p95", "10s", "--format", "json")
    assert code == 1
    checks = {check["metric"]: check for check in json.loads(out)["runs"][0]["checks"]}
    assert checks["serve_ttft_p95_s"]["verdict"] == "missing"
    assert checks["serve_failed_requests"]["verdict"] == "missing"
    # one request of eight fails (a stalled server behind a fast one is not needed: write it)
    from quantkit.inputs.specs import GateSpec
    from quantkit.results.gate import evaluate_gate

    metrics = {"serve_ttft_p95_s": 0.2, "serve_goodput": 1.0, "serve_failed_requests": 1.0}
    spec = GateSpec(max_serve_ttft_p95_s=1.0, min_serve_goodput=0.5)
    result = evaluate_gate(spec, dict(metrics), None, None)
    assert [(c.metric, c.passed) for c in result.checks] == [
        ("serve_ttft_p95_s", True),
        ("serve_goodput", True),
        ("serve_failed_requests", False),
    ]
    assert not result.passed


def test_poisson_arrivals_at_a_request_rate_without_a_run(
    tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The load at --request-rate: requests leave on the seeded exponential schedule, so the
    level lasts at least until the last arrival; the endpoint-only form prints JSON."""
    args = ["--request-rate", "40", "--requests", "12", "--max-tokens", "4", "--prompt-lengths", "16,24"]
    with start_server("instant") as url:
        code, out, err = run_cli(
            capsys, "bench", "--endpoint", url, "--tokenizer", tiny_model, *args, "--format", "json"
        )
    assert code == 0, err
    (measured,) = json.loads(out)
    (level,) = measured["levels"]
    assert measured["run"] is None and measured["server"]["version"] == "quantkit-test-instant"
    assert (level["request_rate"], level["concurrency"], level["completed"], level["failed"]) == (
        40.0,
        None,
        12,
        0,
    )
    gaps = __import__("numpy").random.default_rng(0).exponential(1 / 40, size=12)
    last_arrival = float(gaps[1:].sum())
    assert last_arrival > 0.1 and level["duration_s"] >= last_arrival
    assert level["output_tokens"] == 12 * 4  # the server's chunks, one token each


def test_every_request_comes_on_a_connection_of_its_own(
    tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No pooled keep-alive connections: llama.cpp's llama-server (cpp-httplib) closes an idle
    one after a few requests without saying so, and a request sent on it failed with
    'Server disconnected without sending a response' (4 of 40 sequential requests)."""
    import httpx

    args = ["--concurrency", "1,2", "--requests", "6", "--max-tokens", "2", "--prompt-lengths", "16"]
    with start_server("instant") as url:
        code, _, err = run_cli(capsys, "bench", "--endpoint", url, "--tokenizer", tiny_model, *args)
        counted = httpx.get(url.removesuffix("/v1") + "/connections").json()
    assert code == 0, err
    assert counted == {"requests": 14, "connections": 14}  # 2 warm-up requests + 2 levels x 6


def test_serve_refuses_an_unknown_server_parallel_slots_it_lacks_and_a_missing_llama_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked before the GGUF is even looked at (a missing file would be the later error)."""
    absent = tmp_path / "absent.gguf"
    code, _, err = run_cli(capsys, "serve", absent, "--server", "vllm")
    assert code == 2
    assert one_error(err) == (
        "error: unknown server 'vllm'",
        "hint: choose one of: llama-cpp-python, llama-server",
    )
    code, _, err = run_cli(capsys, "serve", absent, "--parallel", "4")
    assert code == 2
    assert one_error(err) == (
        "error: llama-cpp-python's server decodes one request at a time, not 4",
        "hint: use --server llama-server for parallel slots (continuous batching)",
    )
    monkeypatch.setenv("QUANTKIT_LLAMA_SERVER", str(tmp_path / "llama-server"))
    code, _, err = run_cli(capsys, "serve", absent, "--server", "llama-server", "--parallel", "4")
    assert code == 2
    first, hint = one_error(err)
    assert first == f"error: QUANTKIT_LLAMA_SERVER='{tmp_path / 'llama-server'}' is not an executable file"
    assert "python -m quantkit.llamacpp.build llama-server" in hint
    # neither set, nor on PATH, nor built into this (empty) cache
    monkeypatch.delenv("QUANTKIT_LLAMA_SERVER")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("QUANTKIT_CACHE", str(tmp_path / "cache"))
    code, _, err = run_cli(capsys, "serve", absent, "--server", "llama-server")
    assert code == 2
    first, hint = one_error(err)
    assert first == "error: llama.cpp's llama-server is not installed"
    assert hint.startswith("hint: put llama.cpp's llama-server on PATH or in QUANTKIT_LLAMA_SERVER")
