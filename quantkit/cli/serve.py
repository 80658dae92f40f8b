"""`quantkit serve TARGET`: an OpenAI-compatible llama.cpp server (llama-cpp-python's, or
llama.cpp's llama-server with parallel slots) on a GGUF (a run's artifact, its baseline as an
F16 GGUF, or a .gguf file); prints the URL, stops on Ctrl-C."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from quantkit.cli.output import stderr
from quantkit.errors import UserInputError

VLLM_HINT = "serve it with vLLM on a GPU: vllm serve {path} (see docs/serving.md)"


def serve(
    target: Path = typer.Argument(..., help="a run folder (GGUF artifact) or a .gguf file", metavar="TARGET"),
    baseline: bool = typer.Option(
        False, "--baseline", help="serve the run's unquantized model (as an F16 GGUF) instead of its artifact"
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (loopback by default)"),
    port: int | None = typer.Option(None, "--port", help="port (default: a free one)"),
    context_length: int = typer.Option(4096, "--context-length", help="the server's context (n_ctx)"),
    threads: int | None = typer.Option(None, "--threads", help="llama.cpp threads (default: its own)"),
    name: str | None = typer.Option(
        None, "--name", help="the model name clients request (default: the run's)"
    ),
    server_kind: str = typer.Option(
        "llama-cpp-python",
        "--server",
        help="llama-cpp-python (one request at a time) or llama-server (llama.cpp's, parallel slots)",
    ),
    parallel: int = typer.Option(
        1, "--parallel", min=1, help="requests decoded together (llama-server's slots)"
    ),
) -> None:
    """Start a llama.cpp server on a GGUF, wait until it answers, print its base URL (stdout) and
    keep it running until Ctrl-C. HF-format artifacts (FP8, GPTQ, AWQ) are served by vLLM:
    `vllm serve RUN/artifact`, then `quantkit bench RUN --endpoint URL`."""
    import signal
    import time

    from quantkit.serving.server import SERVERS, ServeSettings

    server_class = SERVERS.get(server_kind)
    server_class.check(parallel)
    gguf, alias = _target(target, baseline, server_class.runtime)
    server = server_class(ServeSettings(gguf, name or alias, host, port, context_length, threads, parallel))
    # `kill` stops the server too, as Ctrl-C does; SIGINT too when the shell that started this in
    # the background (`quantkit serve ... &` in a script) set it to be ignored
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        server.start()
    except KeyboardInterrupt:
        server.stop()
        raise
    typer.echo(server.url)
    slots = f", {parallel} parallel slots" if parallel > 1 else ""
    stderr.print(
        f"{server.label} serving {escape(server.alias)} from {escape(str(gguf))}{slots}; Ctrl-C stops it"
    )
    try:
        while server.process is not None and server.process.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        server.stop()
        stderr.print("stopped")
        return
    code = server.process.returncode if server.process is not None else 0
    server.stop()
    raise UserInputError(f"the server exited with code {code}", f"its log is {server.log_path}")


def _target(target: Path, baseline: bool, runtime: str) -> tuple[Path, str]:
    """The GGUF file to serve and the model name to serve it as (a run's artifact must be one
    of ``runtime``, the server's)."""
    from quantkit.runtimes.llamacpp import check_gguf, gguf_file

    if target.is_file():
        if baseline:
            raise UserInputError(
                "--baseline needs a run folder", f"quantkit serve RUN --baseline, not {target}"
            )
        if target.suffix != ".gguf":
            raise UserInputError(f"'{target}' is not a .gguf file", "give a run folder or a .gguf file")
        check_gguf(target)
        return target, target.stem
    from quantkit.results.store import load_run

    record = load_run(target)
    manifest = record.manifest
    if baseline:
        return _baseline_gguf(Path(manifest.model.path)), f"{manifest.display_name}-baseline"
    artifact = record.path / manifest.artifact.path
    if manifest.artifact.runtime != runtime:
        raise UserInputError(
            f"run '{record.name}' is a {manifest.artifact.format} artifact, not a GGUF "
            "(quantkit serve starts llama.cpp)",
            VLLM_HINT.format(path=artifact),
        )
    gguf = gguf_file(artifact)
    check_gguf(gguf)
    return gguf, manifest.display_name


def _baseline_gguf(model_path: Path) -> Path:
    """The run's unquantized model as an F16 GGUF (converted once, cached)."""
    from quantkit.backends.gguf import GGUFBackend, GGUFOptions

    if not model_path.exists():
        raise UserInputError(f"the run's baseline model '{model_path}' is gone", "quantize again")
    backend = GGUFBackend(GGUFOptions(type="F16"))
    converted = backend.runtime_baseline(model_path, lambda message: stderr.print(escape(message)))
    assert converted is not None
    return converted


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
