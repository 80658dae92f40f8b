"""``quantkit serve``: llama-cpp-python's OpenAI-compatible server on a GGUF, in a process of
its own, on a free loopback port unless told otherwise; started, waited for, stopped.

The server runs with ``interrupt_requests`` off: by default llama-cpp-python ends a streamed
completion as soon as another request waits for the model, which cuts every stream short
under concurrency. It still runs one request at a time (one model instance behind a lock):
concurrency queues requests there instead of batching them.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from quantkit.errors import MissingDependencyError, UserInputError

SERVER_EXTRA = "pip install 'quantkit[serve]' (llama-cpp-python's server and the openai client)"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def check_server_installed() -> None:
    import importlib.util

    for module in ("llama_cpp", "fastapi", "uvicorn", "sse_starlette", "starlette_context"):
        if importlib.util.find_spec(module) is None:
            raise MissingDependencyError(
                f"quantkit serve needs llama-cpp-python's server ({module})", SERVER_EXTRA
            )


class LlamaServer:
    """llama-cpp-python's server on ``gguf`` at ``http://host:port/v1``, serving it as ``alias``."""

    def __init__(
        self,
        gguf: Path,
        alias: str,
        host: str = "127.0.0.1",
        port: int | None = None,
        context_length: int = 4096,
        threads: int | None = None,
    ) -> None:
        self.gguf = gguf
        self.alias = alias
        self.host = host
        self.port = port or free_port(host)
        self.context_length = context_length
        self.threads = threads
        self.process: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - open for the server's lifetime
            prefix="quantkit-serve-", suffix=".log", delete=False
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def log_path(self) -> Path:
        return Path(self._log.name)

    def command(self) -> list[str]:
        command = [
            sys.executable, "-m", "llama_cpp.server",
            "--model", str(self.gguf),
            "--model_alias", self.alias,
            "--host", self.host,
            "--port", str(self.port),
            "--n_ctx", str(self.context_length),
            "--interrupt_requests", "False",
        ]  # fmt: skip
        if self.threads is not None:
            command += ["--n_threads", str(self.threads), "--n_threads_batch", str(self.threads)]
        return command

    def start(self, timeout_s: float = 120.0) -> str:
        """Start the server and wait until it lists its model; its URL."""
        check_server_installed()
        self.process = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise UserInputError(
                    f"llama-cpp-python's server exited with code {self.process.returncode} before answering: "
                    f"{self._last_line()}",
                    f"its log is {self.log_path}",
                )
            if self._answers():
                return self.url
            time.sleep(0.25)
        self.stop()
        raise UserInputError(
            f"llama-cpp-python's server did not answer within {timeout_s:g} s", f"its log is {self.log_path}"
        )

    def _answers(self) -> bool:
        import httpx

        try:
            return httpx.get(f"{self.url}/models", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _last_line(self) -> str:
        lines = [line for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        return lines[-1] if lines else "(no output)"

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
