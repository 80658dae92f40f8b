"""Serving on the real SmolLM2: llama-cpp-python's server started by `quantkit serve` (a real
server on loopback, stopped with Ctrl-C's signal), loaded by `quantkit bench --endpoint`; quality
through the endpoint refused on that server (its echo log-probs are one position late) and
measured through vLLM's scoring format (tests/servers: llama.cpp's numbers), where it must agree
with quantkit's in-process llama.cpp evaluation."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require_extra
from servers import start_server, wait_until_answering

from quantkit.cli import main

require_extra("openai", "serve")
require_extra("fastapi", "serve")
require_extra("llama_cpp", "gguf")

pytestmark = pytest.mark.slow

BUDGET = ["--set", "eval.num_windows=2", "--set", "eval.seq_len=128", "--device", "cpu", "--no-bench"]
LOAD = ["--requests", "8", "--max-tokens", "8", "--prompt-lengths", "32,64", "--timeout", "60s"]
PRICE = 3.0


@pytest.fixture(scope="module")
def run(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("serving") / "q4"
    assert main(["quantize", "gguf-q4_k_m", *BUDGET, "--out", str(folder)]) == 0
    return folder


def manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


class Served:
    def __init__(self, process: subprocess.Popen[str], url: str) -> None:
        self.process, self.url = process, url


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _serve(*args: str, sigint_ignored: bool = False) -> Iterator[Served]:
    """``quantkit serve *args``; with ``sigint_ignored`` started as a script's ``... &`` starts it."""
    process = subprocess.Popen(
        [sys.executable, "-m", "quantkit", "serve", *args, "--threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ignore_sigint if sigint_ignored else None,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1"), (
            process.stderr.read() if process.stderr else ""
        )
        wait_until_answering(url, process)  # type: ignore[arg-type]
        yield Served(process, url)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()  # the server child is orphaned then; its own test fails
                raise


@pytest.fixture(scope="module")
def served(run: Path) -> Iterator[Served]:
    yield from _serve(str(run))


def test_bench_through_llama_cpp_pythons_server_stores_every_metric(
    run: Path, served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["bench", str(run), "--endpoint", served.url, "--concurrency", "1,4", *LOAD]
    args += ["--slo", "ttft=120s,tpot=10s", "--price-per-hour", str(PRICE)]
    assert main(args) == 0
    capsys.readouterr()
    data = manifest(run)
    side = data["serve"]["artifact"]
    assert side["server"]["model"] == "gguf-q4_k_m" and side["server"]["server"] == "uvicorn"
    assert side["server"]["url"] == served.url
    one, four = side["levels"]
    assert (one["concurrency"], four["concurrency"]) == (1, 4)
    for level in (one, four):
        assert (level["requests"], level["completed"], level["failed"], level["errors"]) == (8, 8, 0, {})
        assert 8 <= level["output_tokens"] <= 64 and level["prompt_tokens"] > 0
        for name in ("ttft", "tpot", "itl", "e2e"):
            dist = level[name]
            assert dist["count"] > 0, name
            assert 0 < dist["p50"] <= dist["p90"] <= dist["p95"] <= dist["p99"], name
        assert level["e2e"]["p50"] > level["ttft"]["p50"]
        assert level["goodput"] == 1.0  # every request within the loose SLO
    # llama-cpp-python's server runs one request at a time behind a lock: four in flight queue
    # (the first token waits for the others) and the throughput stays that of one
    assert four["ttft"]["p50"] > 1.5 * one["ttft"]["p50"]
    assert 0.6 < four["output_tok_s"] / one["output_tok_s"] < 1.6
    metrics = {key: value["value"] for key, value in data["metrics"]["quantized"].items()}
    assert metrics["serve_ttft_p95_s"] == four["ttft"]["p95"]  # the headline: the highest level
    assert metrics["serve_output_tok_s"] == four["output_tok_s"] and metrics["serve_failed_requests"] == 0
    assert metrics["serve_goodput"] == 1.0
    assert math.isclose(metrics["serve_cost_per_request_usd"], PRICE / 3600 / four["request_throughput"])
    assert math.isclose(metrics["serve_cost_per_mtok_usd"], PRICE / 3600 / four["output_tok_s"] * 1e6)
    assert data["stages"]["serve_bench"] and data["timings"]["serve_bench_s"] > 0
    # the gate reads the stored figures: a generous bound passes, a 1 ms TTFT fails
    assert (
        main(["gate", str(run), "--max-ttft-p95", "120s", "--min-goodput", "0.9", "--min-output-tok-s", "1"])
        == 0
    )
    assert main(["gate", str(run), "--max-ttft-p95", "1ms"]) == 1
    capsys.readouterr()


def test_the_baseline_served_the_same_way_joins_the_run_and_the_plot(
    run: Path, served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for base in _serve(str(run), "--baseline"):
        args = ["bench", str(run), "--endpoint", base.url, "--side", "baseline", "--concurrency", "1,2"]
        assert main([*args, *LOAD]) == 0
    data = manifest(run)
    assert data["serve"]["baseline"]["server"]["model"] == "gguf-q4_k_m-baseline"
    assert [level["concurrency"] for level in data["serve"]["baseline"]["levels"]] == [1, 2]
    assert data["serve"]["artifact"] is not None  # the artifact's measurement is kept
    assert data["metrics"]["baseline"]["serve_output_tok_s"]["value"] > 0
    assert main(["report", str(run), "-o", str(tmp_path / "r.html"), "-o", str(tmp_path / "r.json")]) == 0
    html = (tmp_path / "r.html").read_text()
    assert 'id="plot-served"' in html and html.count('class="series"') == 2
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert [len(row["serve_levels"]) for row in rows] == [2, 2]
    capsys.readouterr()


def test_quality_through_llama_cpp_pythons_echo_is_refused_as_shifted(
    run: Path, served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    before = manifest(run).get("served_quality")
    assert main(["eval", str(run), "--endpoint", served.url, "--top-logprobs", "5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-2].startswith(
        f"error: the server at {served.url} cannot be scored: its prompt log-probs are "
    )
    assert "shifted by one position" in err[-2] and "llama-cpp-python" in err[-2]
    late = float(err[-2].split("% at the same position, ")[1].split(" %")[0])
    assert late > 60  # the served top-1 matches the baseline's one position later
    assert manifest(run).get("served_quality") == before


class TopKOnly:
    """An in-process runtime scored like an endpoint: its own top-k only, k as asked."""

    name = "llama.cpp top-k"
    scores_any_token = False

    def __init__(self, runtime: object, k: int) -> None:
        self.runtime, self.k = runtime, k

    def score(self, request):  # type: ignore[no-untyped-def]
        from dataclasses import replace

        return self.runtime.score(replace(request, top_k=self.k))  # type: ignore[attr-defined]


def test_quality_through_vllms_scoring_format_agrees_with_the_in_process_evaluation(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with start_server("vllm", run / "artifact" / "model.gguf") as url:
        assert main(["eval", str(run), "--endpoint", url, "--top-logprobs", "20"]) == 0
    capsys.readouterr()
    data = manifest(run)
    served = data["served_quality"]
    assert served["protocol"] == "prompt_logprobs" and served["top_k"] == 20
    assert served["alignment"]["aligned"] > 0.5 > served["alignment"]["late"]
    metrics = data["metrics"]["quantized"]
    in_process = {name: metrics[name]["value"] for name in ("ppl", "kld_mean", "top1_agreement_pct")}
    assert abs(served["metrics"]["served_ppl"] / in_process["ppl"] - 1) < 0.005
    assert abs(served["metrics"]["served_top1_agreement_pct"] - in_process["top1_agreement_pct"]) < 0.5
    # the same estimator in process (llama.cpp's own top-20 + rest) gives the same KLD
    from transformers import AutoTokenizer

    from quantkit.evals.quality import score, summarize
    from quantkit.evals.reference import load_cached
    from quantkit.inputs.calibration import eval_windows
    from quantkit.inputs.recipe import Recipe
    from quantkit.runtimes import open_runtime
    from quantkit.runtimes.base import RuntimeSettings

    reference = load_cached(data["eval"]["reference_key"])
    recipe = Recipe.model_validate(data["recipe"])
    windows = eval_windows(recipe.eval, AutoTokenizer.from_pretrained(data["model"]["path"]))
    assert windows.hash == data["eval"]["hash"]
    runtime = open_runtime("llamacpp", run / "artifact", RuntimeSettings(device="cpu", context_length=128))
    try:
        topk = summarize(score(TopKOnly(runtime, 20), windows, reference, 4), 1.0)
    finally:
        runtime.close()
    assert abs(served["metrics"]["served_kld_mean"] / topk["kld_mean"] - 1) < 0.02
    # a lower bound of the sampled-tail KLD the run measured in process
    assert 0.6 * in_process["kld_mean"] < served["metrics"]["served_kld_mean"] < in_process["kld_mean"]


def test_quantkit_serve_stops_on_ctrl_c_and_refuses_what_it_cannot_serve(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # started in the background by a non-interactive shell (SIGINT ignored): Ctrl-C's signal still stops it
    for served_now in _serve(str(run), sigint_ignored=True):
        served_now.process.send_signal(signal.SIGINT)
        assert served_now.process.wait(timeout=30) == 0
        assert served_now.process.stderr is not None and "stopped" in served_now.process.stderr.read()
        import httpx

        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{served_now.url}/models", timeout=2.0)
    text = tmp_path / "model.txt"
    text.write_text("not a model")
    assert main(["serve", str(text)]) == 2
    assert "is not a .gguf file" in capsys.readouterr().err
