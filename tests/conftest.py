"""Shared fixtures: an isolated cache, offline hub settings, and a tiny random Llama."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The speed/memory stage spawns a process per model; only the tests about it turn it on.
os.environ.setdefault("QUANTKIT_NO_BENCH", "1")


# The modules that take longest (minutes of one worker each, `make test`'s --durations): run
# first, so that two workers (`--dist loadfile`) end together instead of one finishing the
# longest module alone while the other idles.
LONGEST_FIRST = (
    "tests/e2e/test_weight_only_smollm2.py",
    "tests/e2e/test_gemma3.py",
    "tests/e2e/test_gguf_smollm2.py",
    "tests/e2e/test_autoround_smollm2.py",
    "tests/e2e/test_sweep_smollm2.py",
    "tests/e2e/test_smollm2.py",
    "tests/e2e/test_search_smollm2.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest modules first (a stable sort: every worker collects the same order);
    ``gpu`` tests run only where torch sees a CUDA device."""

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::")[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
        for item in gpu:
            item.add_marker(skip)


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every worker of this pytest session sees: under xdist the parent of the
    workers' own base folders, else this session's base folder."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This pytest session's quantkit cache, shared by its xdist workers: a model converted, a
    GGUF made or a reference computed by one worker is reused by the other (quantkit makes each
    cache entry under a lock, tests/unit/test_cache_lock.py)."""
    folder = shared_root(tmp_path_factory) / "quantkit-cache"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class SharedRuns:
    """`quantkit quantize` runs made once per pytest session and read by every module that asks
    for the same arguments, whichever worker asks first (the others wait on its lock). Read-only
    by convention: a test that changes a run copies it first."""

    def __init__(self, root: Path, cache: Path) -> None:
        self.root = root
        self.cache = cache
        root.mkdir(parents=True, exist_ok=True)

    def quantize(self, recipe: str, *args: str) -> tuple[Path, int]:
        """The run folder of ``quantkit quantize recipe --out DIR *args`` and its exit code."""
        import fcntl
        import hashlib
        import json

        from quantkit.cli import main

        key = hashlib.sha256(json.dumps([recipe, *args]).encode()).hexdigest()[:16]
        out, code_file = self.root / key, self.root / f"{key}.code"
        with (self.root / f"{key}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not code_file.is_file():
                os.environ["QUANTKIT_CACHE"] = str(self.cache)
                code = main(["quantize", recipe, "--out", str(out), *args])
                code_file.write_text(str(code))
            return out, int(code_file.read_text())


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory: pytest.TempPathFactory, session_cache: Path) -> SharedRuns:
    return SharedRuns(shared_root(tmp_path_factory) / "shared-runs", session_cache)


@pytest.fixture(autouse=True)
def isolated_cache(session_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Every test uses the session's cache and its own runs folder."""
    monkeypatch.setenv("QUANTKIT_CACHE", str(session_cache))
    monkeypatch.setenv("QUANTKIT_RUNS_DIR", str(tmp_path / "runs"))
    return session_cache


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with a trained byte-level BPE tokenizer (read-only by convention)."""
    from quantkit.util.testing import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="module")
def smollm2(session_cache: Path) -> Path:
    """The embedded SmolLM2-135M-Instruct's HF folder (converted once into the session cache)."""
    os.environ["QUANTKIT_CACHE"] = str(session_cache)
    from quantkit.inputs.models import resolve_model

    return resolve_model("smollm2-135m").path


# Small enough for a 2-core CI machine; shared by the SmolLM2 end-to-end modules so their runs
# use the same calibration and eval tokens.
E2E_BUDGET = [
    "--set", "eval.num_windows=8", "--set", "eval.seq_len=256",
    "--set", "calibration.num_samples=8", "--set", "calibration.seq_len=256", "--device", "cpu",
]  # fmt: skip


def write_tiny_recipe(folder: Path, model: Path, num_windows: int = 4, batch_size: int = 2) -> Path:
    """Write a small FP8-dynamic recipe on ``model`` into ``folder``. Its gate, max_kld_mean 0.005,
    separates the real artifact (KLD ~9e-5) from a corrupted one (the tiny model with its
    matrices' rows shuffled: ~0.05; tests/cli/test_external.py), where 1.0 let both pass."""
    path = folder / "tiny.yaml"
    path.write_text(
        f"""
name: tiny-fp8
method: fp8
options: {{scheme: FP8_DYNAMIC}}
model: {model}
device: cpu
calibration: {{num_samples: 4, seq_len: 64}}
eval: {{num_windows: {num_windows}, seq_len: 64, top_k: 8, batch_size: {batch_size}}}
gates: {{max_kld_mean: 0.005}}
""",
        encoding="utf-8",
    )
    return path


@pytest.fixture
def tiny_recipe(tmp_path: Path, tiny_model: Path) -> Path:
    """A small FP8-dynamic recipe on the tiny model."""
    return write_tiny_recipe(tmp_path, tiny_model)


V1_RUN = Path(__file__).parent / "data" / "run-v1"  # a run written by quantkit 0.1 (manifest schema 1)


def synthetic_record(
    name: str, scheme: str, quantized: dict[str, float], baseline: dict[str, float], **fields: object
):
    """A run record with chosen metrics, built on the schema-1 run in tests/data (for report
    tests that need many runs). ``fields``: ``bits``, ``disk``, ``model``, ``fingerprint``."""
    import json

    from quantkit.results.manifest import Manifest, with_info
    from quantkit.results.store import RunRecord

    data = json.loads((V1_RUN / "manifest.json").read_text())
    run_id = "20260101-000000-" + "".join(c if c.isalnum() else "-" for c in name)
    data |= {"run_id": run_id, "name": name, "gate": None, "bench": None, "lm_eval": None, "stages": {}}
    data["recipe"]["method"] = "gptq"
    data["model"] |= {
        "spec": fields.get("model", "tiny/model"),
        "fingerprint": fields.get("fingerprint", "f" * 64),
        "disk_bytes": 540_000_000,
        "parameters": 135_000_000,
    }
    data["baseline"] = {"dtype": "bfloat16", "weight_bits": 16}
    data["artifact"] |= {
        "scheme": scheme,
        "weight_bits": fields.get("bits", 4.0),
        "disk_bytes": fields.get("disk", 1),
    }
    data["metrics"] = {
        "baseline": {key: value.model_dump() for key, value in with_info(baseline).items()},
        "quantized": {key: value.model_dump() for key, value in with_info(quantized).items()},
    }
    data["timings"] = {"quantize_s": 3.5}
    return RunRecord(path=Path("/runs") / run_id, manifest=Manifest.model_validate(data))


CHROMIUM = Path("/usr/bin/chromium")


def run_chromium(tmp_path: Path, *args: str, window: str = "1400,1000") -> subprocess.CompletedProcess[str]:
    """Run headless Chromium (Debian package) with a fresh profile and a ``window`` of that
    size; fail clearly when absent."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install the Debian package 'chromium' to run the browser check")
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--window-size={window}",
        *args,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def require_extra(module: str, extra: str) -> None:
    """Import ``module`` or fail: in ``make test`` every extra is installed, so a missing one is a
    broken setup, not a reason for its coverage to vanish. ``QUANTKIT_ALLOW_MISSING_EXTRAS=1``
    turns the failure into a skip for partial installs (e.g. ``pip install quantkit[gptq]``)."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError as err:
        message = f"{module} is missing ({err}); install quantkit[{extra}] (make test installs it)"
        if os.environ.get("QUANTKIT_ALLOW_MISSING_EXTRAS") == "1":
            pytest.skip(message, allow_module_level=True)
        pytest.fail(message, pytrace=False)
