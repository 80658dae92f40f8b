"""``quantkit serve``: an OpenAI-compatible llama.cpp server on a GGUF, in a process of its own,
on a free loopback port unless told otherwise; started, waited for, stopped.

Two servers, one registry (:data:`SERVERS`):

- ``llama-cpp-python``: the bindings' server (the ``serve`` extra). It runs one request at a
  time (one model instance behind a lock): concurrency queues requests instead of batching
  them. It runs with ``interrupt_requests`` off: by default it ends a streamed completion as
  soon as another request waits, which cuts every stream short under concurrency.
- ``llama-server``: llama.cpp's own server, what users deploy GGUFs with. ``--parallel N``
  slots decode together (continuous batching), so throughput grows with concurrency. Found on
  PATH, through ``QUANTKIT_LLAMA_SERVER``, or built once from the bindings' sdist
  (:mod:`quantkit.llamacpp.build`).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import ClassVar

from quantkit.errors import MissingDependencyError, UserInputError
from quantkit.registry import Registry

SERVER_EXTRA = "pip install 'quantkit[serve]' (llama-cpp-python's server and the openai client)"
LLAMA_SERVER_HINT = (
    "put llama.cpp's llama-server on PATH or in QUANTKIT_LLAMA_SERVER, or build it once from "
    "llama-cpp-python's sdist: python -m quantkit.llamacpp.build llama-server (a few minutes)"
)


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


@dataclass(frozen=True)
class ServeSettings:
    """What to serve and how: the GGUF, the model name clients ask for, where, and the sizes."""

    gguf: Path
    alias: str
    host: str = "127.0.0.1"
    port: int | None = None
    context_length: int = 4096  # per request (per slot)
    threads: int | None = None
    parallel: int = 1  # requests decoded together


class ManagedServer:
    """A server process on ``settings.gguf`` at ``http://host:port/v1``; subclasses say how to start it."""

    label: ClassVar[str] = "server"
    runtime: ClassVar[str] = "llamacpp"  # the runtime whose artifacts it serves (GGUFs)

    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        self.port = settings.port or free_port(settings.host)
        self.process: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - open for the server's lifetime
            prefix="quantkit-serve-", suffix=".log", delete=False
        )

    @property
    def alias(self) -> str:
        return self.settings.alias

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}/v1"

    @property
    def log_path(self) -> Path:
        return Path(self._log.name)

    @classmethod
    def check(cls, parallel: int) -> None:
        """Refuse, before anything loads, what this server lacks (not installed, settings)."""

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout_s: float = 120.0) -> str:
        """Start the server and wait until it lists its model; its URL."""
        self.check(self.settings.parallel)
        self.process = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise UserInputError(
                    f"{self.label} exited with code {self.process.returncode} before answering: "
                    f"{self._last_line()}",
                    f"its log is {self.log_path}",
                )
            if self._answers():
                return self.url
            time.sleep(0.25)
        self.stop()
        raise UserInputError(
            f"{self.label} did not answer within {timeout_s:g} s", f"its log is {self.log_path}"
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

    def __enter__(self) -> ManagedServer:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()


class LlamaCppPythonServer(ManagedServer):
    """llama-cpp-python's server: one request at a time."""

    label = "llama-cpp-python's server"

    @classmethod
    def check(cls, parallel: int) -> None:
        check_server_installed()
        if parallel != 1:
            raise UserInputError(
                f"llama-cpp-python's server decodes one request at a time, not {parallel}",
                "use --server llama-server for parallel slots (continuous batching)",
            )

    def command(self) -> list[str]:
        s = self.settings
        command = [
            sys.executable, "-m", "llama_cpp.server",
            "--model", str(s.gguf),
            "--model_alias", s.alias,
            "--host", s.host,
            "--port", str(self.port),
            "--n_ctx", str(s.context_length),
            "--interrupt_requests", "False",
        ]  # fmt: skip
        if s.threads is not None:
            command += ["--n_threads", str(s.threads), "--n_threads_batch", str(s.threads)]
        return command


def llama_server_binary() -> Path:
    """llama.cpp's ``llama-server``: ``QUANTKIT_LLAMA_SERVER``, else on PATH, else quantkit's build."""
    env = os.environ.get("QUANTKIT_LLAMA_SERVER")
    if env:
        path = Path(env).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise MissingDependencyError(
                f"QUANTKIT_LLAMA_SERVER='{env}' is not an executable file", LLAMA_SERVER_HINT
            )
        return path
    found = shutil.which("llama-server")
    if found:
        return Path(found)
    from quantkit.llamacpp.build import cached_tool

    built = cached_tool("llama-server")
    if built.is_file():
        return built
    raise MissingDependencyError("llama.cpp's llama-server is not installed", LLAMA_SERVER_HINT)


class LlamaCppServer(ManagedServer):
    """llama.cpp's ``llama-server``: ``parallel`` slots with continuous batching."""

    label = "llama.cpp's llama-server"

    @classmethod
    def check(cls, parallel: int) -> None:
        llama_server_binary()

    def command(self) -> list[str]:
        s = self.settings
        command = [
            str(llama_server_binary()),
            "--model", str(s.gguf),
            "--alias", s.alias,
            "--host", s.host,
            "--port", str(self.port),
            "--ctx-size", str(s.context_length * s.parallel),  # shared by the slots
            "--parallel", str(s.parallel),
            "--no-webui",
        ]  # fmt: skip
        if s.threads is not None:
            command += ["--threads", str(s.threads), "--threads-batch", str(s.threads)]
        return command


SERVERS: Registry[type[ManagedServer]] = Registry(
    "server",
    {
        "llama-cpp-python": "quantkit.serving.server:LlamaCppPythonServer",
        "llama-server": "quantkit.serving.server:LlamaCppServer",
    },
    UserInputError,
    group="quantkit.servers",
)
