"""Servers the serving tests start on loopback and stop: ``openai_server`` (small
OpenAI-compatible servers) and ``quantkit serve`` (llama-cpp-python's)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until_answering(url: str, process: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the server exited with {process.returncode}"
        try:
            if httpx.get(f"{url}/models", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} did not answer within {timeout_s} s")


@contextmanager
def start_server(mode: str, gguf: Path | None = None) -> Iterator[str]:
    """``tests/servers/openai_server.py MODE`` on a free loopback port; its base URL."""
    port = free_port()
    command = [sys.executable, str(HERE / "openai_server.py"), mode, str(port)]
    process = subprocess.Popen([*command, *([str(gguf)] if gguf else [])])
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_until_answering(url, process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
