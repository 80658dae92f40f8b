"""A sweep on a real two-node Ray cluster on this machine (loopback only): `ray start --head`
plus `ray start --address`, started and stopped here. The runs land on both nodes, their
metrics equal a local sequential sweep's, and a worker SIGKILLed mid-quantization is retried
by Ray and resumed from its journal to the same metrics.

The cluster runs with Ray's token authentication, from a token of its own: since Ray 2.59 a
head started where ``~/.ray/auth_token`` exists (``ray.init()`` writes one) turns token auth on
by itself while workers given an address do not, so a cluster that relied on the machine's
home folder would fail on any machine where Ray ran before."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require_extra

from quantkit.cli import main

require_extra("ray", "ray")

TINY = [
    "--set", "eval.num_windows=4", "--set", "eval.seq_len=64", "--set", "eval.top_k=8",
    "--set", "calibration.num_samples=4", "--set", "calibration.seq_len=64", "--device", "cpu", "--no-bench",
]  # fmt: skip
# GPTQ twice (the failpoint is in its per-layer loop) and one RTN
RECIPES = ["gptq-w4a16-g128", "rtn-w4a16-g64", "--grid", "options.group_size=32,64"]
QUALITY = ("ppl", "kld_mean", "kld_p99", "top1_agreement_pct")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _without_ray_auth(env: os._Environ[str] | dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in env.items() if not key.startswith("RAY_AUTH")}


def _ray(*args: str, env: dict[str, str]) -> None:
    ray = str(Path(sys.executable).with_name("ray"))
    result = subprocess.run([ray, *args], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.fixture(scope="module")
def token(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of every process that talks to the cluster: token auth, its own token."""
    path = tmp_path_factory.mktemp("ray-auth") / "auth_token"
    path.write_text(secrets.token_hex(32), encoding="utf-8")
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}


@pytest.fixture(scope="module")
def cluster(
    session_cache: Path, token: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    """Head + one worker node, one CPU each; every worker process dies at GPTQ's second layer
    once (the first to get there), through the failpoint its environment carries."""
    flag = tmp_path_factory.mktemp("failpoint") / "fired"
    env = {
        **_without_ray_auth(os.environ),
        **token,
        "QUANTKIT_CACHE": str(session_cache),
        "QUANTKIT_FAILPOINT": "quantize.layer=1",
        "QUANTKIT_FAILPOINT_ONCE": str(flag),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    port = _free_port()
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--num-gpus=0", "--object-store-memory=80000000"]
    try:
        _ray(
            "start",
            "--head",
            f"--port={port}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            *common,
            env=env,
        )
        _ray("start", f"--address=127.0.0.1:{port}", *common, env=env)
        yield f"127.0.0.1:{port}", flag
    finally:
        subprocess.run(
            [str(Path(sys.executable).with_name("ray")), "stop", "--force"], capture_output=True, timeout=120
        )


@pytest.fixture(scope="module")
def sequential(tiny_model: Path, session_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sequential") / "sweep"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("QUANTKIT_CACHE", str(session_cache))
        patch.delenv("QUANTKIT_FAILPOINT", raising=False)
        assert main(["sweep", *RECIPES, "--model", str(tiny_model), *TINY, "--out", str(folder)]) == 0
    return folder


def quality(folder: Path, run_id: str) -> dict[str, float]:
    manifest = json.loads((folder / "runs" / run_id / "manifest.json").read_text())
    return {key: manifest["metrics"]["quantized"][key]["value"] for key in QUALITY}


def test_a_driver_without_the_clusters_token_is_refused_with_a_hint(
    cluster: tuple[str, Path], tiny_model: Path, session_cache: Path, tmp_path: Path
) -> None:
    address, _ = cluster
    env = {**_without_ray_auth(os.environ), "QUANTKIT_CACHE": str(session_cache), "RAY_AUTH_MODE": "disabled"}
    env.pop("QUANTKIT_FAILPOINT", None)
    out = str(tmp_path / "s")
    args = ["sweep", *RECIPES, "--model", str(tiny_model), *TINY, "--ray", address, "--out", out]
    result = subprocess.run(
        [sys.executable, "-m", "quantkit", *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2, result.stderr[-3000:]
    assert lines[0] == f"error: the Ray cluster at {address} requires token authentication", lines
    assert lines[1].startswith("hint: export RAY_AUTH_MODE=token"), lines
    assert "RAY_AUTH_TOKEN_PATH" in lines[1]
    assert list(tmp_path.iterdir()) == []  # nothing left behind


def test_a_ray_sweep_on_two_nodes_survives_a_killed_worker(
    cluster: tuple[str, Path],
    token: dict[str, str],
    sequential: Path,
    tiny_model: Path,
    session_cache: Path,
    tmp_path: Path,
) -> None:
    address, flag = cluster
    folder = tmp_path / "ray-sweep"
    env = {**_without_ray_auth(os.environ), **token, "QUANTKIT_CACHE": str(session_cache)}
    env.pop("QUANTKIT_FAILPOINT", None)
    args = ["sweep", *RECIPES, "--model", str(tiny_model), *TINY, "--ray", address, "--out", str(folder)]
    result = subprocess.run(
        [sys.executable, "-m", "quantkit", *args], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert flag.is_file()  # a worker was killed mid-quantization
    manifest = json.loads((folder / "sweep.json").read_text())
    runs = manifest["runs"]
    assert [run["state"] for run in runs] == ["done"] * 4
    assert len({run["node"] for run in runs}) == 2  # both nodes ran runs
    (baseline,) = manifest["baselines"]  # computed by a Ray task on a node, not in the driver
    assert baseline["node"] in {run["node"] for run in runs} and baseline["reference_computed"] is False
    assert "ray: 127.0.0.1:" in manifest["executor"]
    resumed = {
        run["run_id"]: json.loads((folder / "runs" / run["run_id"] / "manifest.json").read_text())["resume"]
        for run in runs
    }
    killed = [run_id for run_id, info in resumed.items() if info["resumed_stages"]]
    assert len(killed) == 1 and killed[0].startswith("gptq-"), resumed  # the retry resumed from its journal
    assert resumed[killed[0]]["resumed_stages"] == ["reference"]
    seq = json.loads((sequential / "sweep.json").read_text())
    assert [run["run_id"] for run in runs] == [run["run_id"] for run in seq["runs"]]
    for run in runs:
        assert quality(folder, run["run_id"]) == quality(sequential, run["run_id"]), run["run_id"]
    assert not list((folder / "runs").glob(".*.partial"))
    shutil.rmtree(folder)
