"""An OpenAI-compatible endpoint: its address, the model it serves and what it says it is.

Every server quantkit measures is reached the same way (vLLM, llama.cpp's server,
llama-cpp-python's, Ollama): ``GET /v1/models`` to find the served model, the ``openai``
client for requests. Errors a user can fix (nothing answers, a wrong model name, a URL
without ``/v1``) are ``UserInputError``s with a hint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from quantkit.errors import MissingDependencyError, UserInputError

if TYPE_CHECKING:
    import httpx
    from openai import AsyncOpenAI, Timeout

SERVE_HINT = (
    "start one (quantkit serve RUN for a GGUF; vllm serve RUN/artifact for HF formats) and give its "
    "base URL, e.g. http://127.0.0.1:8000/v1"
)


class ServerInfo(BaseModel):
    """Who answered: recorded with every measurement made through the endpoint."""

    model_config = ConfigDict(extra="forbid")

    url: str
    model: str  # the served model name requests use
    models: list[str]  # every model the server lists
    version: str | None = None  # what the server reports (/version, /props), when it does
    server: str | None = None  # its HTTP Server header


class Endpoint(BaseModel):
    """Where to send requests: the base URL (ending in /v1), the model name, the key."""

    model_config = ConfigDict(extra="forbid")

    url: str
    model: str | None = None  # None: the only (or first) model the server lists
    api_key: str = "EMPTY"
    timeout_s: float = 60.0  # per request: connect, and the longest silence mid-stream

    def client(self) -> AsyncOpenAI:
        """An async client with quantkit's timeouts, no retries (a retry would hide a failed
        request) and no pooled keep-alive connections: each request opens its own, as a new
        client does (loopback connect: tens of microseconds, inside TTFT). llama.cpp's
        llama-server closes idle keep-alive connections without saying so; a request sent on
        one failed with "Server disconnected without sending a response"."""
        timeout = self.timeout()  # checks that openai is installed
        import httpx2  # the openai client's HTTP library
        from openai import AsyncOpenAI, DefaultAsyncHttpxClient

        http = DefaultAsyncHttpxClient(timeout=timeout, limits=httpx2.Limits(max_keepalive_connections=0))
        return AsyncOpenAI(
            base_url=self.url, api_key=self.api_key, timeout=timeout, max_retries=0, http_client=http
        )

    def timeout(self) -> Timeout:
        """The openai clients' timeout: ``timeout_s`` for data, at most 10 s to connect (and the
        check that the openai client is installed)."""
        require_openai()
        from openai import Timeout

        return Timeout(self.timeout_s, connect=min(self.timeout_s, 10.0))

    def root(self) -> str:
        """The server's root URL (the base URL without its trailing /v1)."""
        url = self.url.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url


def require_openai() -> None:
    """The openai client is installed (the ``serve`` extra), or a MissingDependencyError."""
    import importlib.util

    if importlib.util.find_spec("openai") is None:
        raise MissingDependencyError(
            "measuring an endpoint needs the openai client", "pip install 'quantkit[serve]'"
        )


def check_url(url: str) -> str:
    """``url`` if it is an http(s) URL with a host, else a UserInputError."""
    from urllib.parse import urlparse

    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise UserInputError(
            f"'{url}' is not an http(s) URL", "give the server's base URL, e.g. http://127.0.0.1:8000/v1"
        )
    return url.rstrip("/")


def describe(endpoint: Endpoint) -> ServerInfo:
    """Ask the server what it serves (and what it is), or refuse with what went wrong."""
    import httpx

    url = check_url(endpoint.url)
    headers = {"Authorization": f"Bearer {endpoint.api_key}"}
    try:
        with httpx.Client(timeout=httpx.Timeout(min(endpoint.timeout_s, 10.0)), headers=headers) as http:
            response = http.get(f"{url}/models")
            if response.status_code == 404:
                raise UserInputError(
                    f"{url}/models is not found (404): '{url}' is not an OpenAI-compatible base URL",
                    "the base URL usually ends in /v1, e.g. http://127.0.0.1:8000/v1",
                )
            if response.status_code in (401, 403):
                raise UserInputError(
                    f"the server at {url} refused the API key ({response.status_code})",
                    "pass its key with --api-key (or OPENAI_API_KEY)",
                )
            if response.status_code >= 400:
                raise UserInputError(
                    f"the server at {url} answered {response.status_code} to GET /models", SERVE_HINT
                )
            models = [str(item.get("id")) for item in response.json().get("data", []) if item.get("id")]
            version = _version(http, endpoint.root())
            server = response.headers.get("server")
    except httpx.TimeoutException:
        raise UserInputError(
            f"the server at {url} did not answer within {endpoint.timeout_s:g} s", SERVE_HINT
        ) from None
    except httpx.HTTPError as err:
        raise UserInputError(f"no server answers at {url} ({_reason(err)})", SERVE_HINT) from None
    except ValueError:
        raise UserInputError(
            f"the server at {url} answered GET /models with something not JSON", SERVE_HINT
        ) from None
    if not models:
        raise UserInputError(f"the server at {url} lists no models", "check that it loaded one")
    model = endpoint.model or models[0]
    if endpoint.model is not None and endpoint.model not in models:
        raise UserInputError(
            f"the server at {url} serves no model '{endpoint.model}' (it serves: {', '.join(models)})",
            f"--served-model {models[0]}",
        )
    return ServerInfo(url=url, model=model, models=models, version=version, server=server)


def _version(http: httpx.Client, root: str) -> str | None:
    """vLLM's ``GET /version``, else llama.cpp server's ``GET /props`` build info."""
    import httpx

    for path, key in (("/version", "version"), ("/props", "build_info")):
        try:
            response = http.get(f"{root}{path}")
            if response.status_code == 200:
                value = response.json().get(key)
                if value:
                    return str(value)
        except (httpx.HTTPError, ValueError, AttributeError):
            continue
    return None


def _reason(err: Exception) -> str:
    text = str(err).strip() or type(err).__name__
    if "Connection refused" in text or "ConnectError" in type(err).__name__:
        return "connection refused"
    return text.splitlines()[0]
