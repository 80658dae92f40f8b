"""The load generator's own cost: quantkit's client (openai, asyncio) against a server that
answers instantly (tests/servers/openai_server.py ``instant``: ``max_tokens`` streamed chunks,
no model), so that what is measured is the client. Per concurrency level: the client's CPU
seconds per request and per streamed chunk, the request rate it sustained, and its TTFT/ITL
as it saw them with nothing to wait for. Against a real server's request (SmolLM2 Q4_K_M
through llama-cpp-python at c=1: ~0.3-0.6 s) the client's share says how far its latency
figures can be trusted. Writes bench/results/serving_overhead.json.

    .venv/bin/python bench/serving_overhead.py [--requests 200] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    from servers import start_server

    from quantkit.serving.endpoint import Endpoint
    from quantkit.serving.loadgen import LoadSpec, Prompt, run_load

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", default="1,16,64")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    pools = {64: [Prompt(text="word " * 64, tokens=64)]}
    figures: list[dict[str, float | int]] = []
    with start_server("instant") as url:
        endpoint = Endpoint(url=url, model="test-model")
        for concurrency in levels:
            spec = LoadSpec(
                concurrency=[concurrency],
                requests=args.requests,
                max_tokens=args.max_tokens,
                prompt_lengths=[64],
            )
            cpu, wall = time.process_time(), time.perf_counter()
            (level,) = run_load(endpoint, "test-model", pools, spec)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            requests = args.requests + spec.warmup
            figures.append(
                {
                    "concurrency": concurrency,
                    "requests": level.requests,
                    "failed": level.failed,
                    "client_cpu_ms_per_request": round(1000 * cpu / requests, 3),
                    "client_cpu_us_per_chunk": round(1e6 * cpu / (requests * args.max_tokens), 2),
                    "sustained_req_s": round(level.request_throughput, 1),
                    "ttft_p50_ms": round(1000 * (level.ttft.p50 or 0.0), 3),
                    "ttft_p99_ms": round(1000 * (level.ttft.p99 or 0.0), 3),
                    "itl_p50_ms": round(1000 * (level.itl.p50 or 0.0), 3),
                    "itl_p99_ms": round(1000 * (level.itl.p99 or 0.0), 3),
                    "wall_s": round(wall, 2),
                }
            )
            print(json.dumps(figures[-1]))
    result = {
        "benchmark": "serving_overhead",
        "server": "tests/servers/openai_server.py instant (no model: the client is what is measured)",
        "max_tokens": args.max_tokens,
        "machine": {"cpu_count": __import__("os").cpu_count(), "platform": platform.platform()},
        "levels": figures,
        "note": "client and server share this machine's cores; CPU time is the client process's only",
    }
    out = ROOT / "bench" / "results" / "serving_overhead.json"
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
