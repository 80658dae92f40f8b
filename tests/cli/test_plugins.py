"""Plug-ins by entry points (#35): a package installed beside quantkit adds a backend and a
runtime through the ``quantkit.backends`` and ``quantkit.runtimes`` entry-point groups, without
editing quantkit, and every process sees them: the run, and the bench's worker subprocess that
loads the artifact in the plug-in's runtime."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import write_tiny_recipe

PLUGIN = '''
"""A plug-in: FP8 through llm-compressor, scored and benchmarked in its own runtime."""

from typing import ClassVar

from quantkit.backends.fp8 import FP8Backend
from quantkit.runtimes.hf import HFRuntime


class PluginRuntime(HFRuntime):
    name: ClassVar[str] = "transformers (plug-in)"


class PluginFP8Backend(FP8Backend):
    name = "plugin-fp8"
    summary = "FP8 whose artifact runs in the plug-in's runtime"
    runtime = "plugin-hf"
'''
METRIC = '''
"""A plug-in metric: the share of positions whose KLD exceeds 1e-4 nats, gated and reported."""

from quantkit.metrics import GateBound, MetricInfo, WindowForm

THRESHOLD = 1e-4


def share(scores, baseline_ppl):
    return 100.0 * float((scores.kld > THRESHOLD).mean())


HIGH_KLD = MetricInfo(
    "high_kld_pct", "%", False, False, "pct", "positions whose KLD exceeds 1e-4 nats",
    stage="evaluate", compute=share, column="high-KLD %",
    windows=WindowForm("high_kld_pct", lambda scores: 100.0 * (scores.kld > THRESHOLD).mean(-1)),
    gate=GateBound("--max-high-kld", "max share of positions whose KLD exceeds 1e-4 nats, e.g. 5%",
                   value="percent", ge=0, le=100),
)
ARTIFACT_FILES = MetricInfo(
    "artifact_files", "", False, False, "count", "files in the artifact folder", stage="artifact_files",
    column="artifact files", gate=GateBound("--max-artifact-files", "max files in the artifact", ge=0),
)
'''
STAGE = '''
"""A plug-in stage: after quantization, the number of files the artifact holds, as a metric."""

from typing import ClassVar

from quantkit.stages.base import Stage, StageOutput
from quantkit.stages.results import MetricSides, StageResult


class FileCountResult(StageResult):
    timing_key: ClassVar[str | None] = "artifact_files_s"
    files: int

    def metric_values(self):
        return MetricSides(artifact={"artifact_files": float(self.files)})


class FileCountStage(Stage[FileCountResult]):
    kind = "artifact_files"
    depends_on = ("quantize",)
    result_type = FileCountResult

    @classmethod
    def planned(cls, inputs):
        return [cls()]

    def run(self, ctx):
        files = [path for path in ctx.run.artifact_dir.rglob("*") if path.is_file()]
        return StageOutput(FileCountResult(files=len(files), seconds=0.0))
'''
ENTRY_POINTS = """
[quantkit.backends]
plugin-fp8 = quantkit_plugin_demo:PluginFP8Backend

[quantkit.runtimes]
plugin-hf = quantkit_plugin_demo:PluginRuntime

[quantkit.metrics]
high_kld_pct = quantkit_plugin_metric:HIGH_KLD
artifact_files = quantkit_plugin_metric:ARTIFACT_FILES

[quantkit.stages]
artifact_files = quantkit_plugin_stage:FileCountStage
"""
BENCH = ["--set", "bench.prompt_lengths=[16]", "--set", "bench.decode_tokens=4", "--set", "bench.repeats=1",
         "--set", "bench.batch_size=1"]  # fmt: skip


def install_plugin(site: Path) -> Path:
    """The plug-in as pip lays out an installed distribution: its module and its dist-info."""
    (site / "quantkit_plugin_demo.py").parent.mkdir(parents=True, exist_ok=True)
    (site / "quantkit_plugin_demo.py").write_text(PLUGIN)
    (site / "quantkit_plugin_metric.py").write_text(METRIC)
    (site / "quantkit_plugin_stage.py").write_text(STAGE)
    info = site / "quantkit_plugin_demo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: quantkit-plugin-demo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return site


def quantkit(*args: object, site: Path | None, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QUANTKIT_CACHE": str(cache)}
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "quantkit", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)


def test_an_installed_plugin_backend_and_runtime_run_and_bench_end_to_end(
    tmp_path: Path, tiny_model: Path, session_cache: Path
) -> None:
    site = install_plugin(tmp_path / "site")
    recipe = write_tiny_recipe(tmp_path, tiny_model)
    recipe.write_text(recipe.read_text().replace("method: fp8", "method: plugin-fp8"))
    listed = quantkit("backends", "list", "--format", "json", site=site, cache=session_cache)
    assert listed.returncode == 0 and "plugin-fp8" in listed.stdout, listed.stderr
    out = tmp_path / "run"
    done = quantkit("quantize", recipe, "--out", out, "--bench", *BENCH, site=site, cache=session_cache)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["recipe"]["method"] == "plugin-fp8"
    assert manifest["artifact"]["runtime"] == manifest["eval"]["runtime"] == "plugin-hf"
    # measured in the bench's worker subprocess, which found the runtime through the entry point
    assert manifest["bench"]["artifact"]["runtime"] == "plugin-hf"
    assert manifest["bench"]["artifact"]["decode_tok_s"] > 0
    assert 1e-6 < manifest["metrics"]["quantized"]["kld_mean"]["value"] < 0.005  # FP8, as the built-in
    _the_plugin_metric_and_stage_are_computed_gated_and_reported(out, site, session_cache)
    # negative control: without the package the method does not exist (exit 2, before any work)
    missing = quantkit("quantize", recipe, "--out", tmp_path / "none", site=None, cache=session_cache)
    assert missing.returncode == 2 and "unknown method 'plugin-fp8'" in missing.stderr, missing.stderr
    assert not (tmp_path / "none").exists()


def test_a_plugin_that_cannot_be_imported_is_one_error_naming_its_package(
    tmp_path: Path, tiny_model: Path, session_cache: Path
) -> None:
    site = install_plugin(tmp_path / "site")
    (site / "quantkit_plugin_demo.py").write_text("raise ImportError('needs a library it lacks')\n")
    recipe = write_tiny_recipe(tmp_path, tiny_model)
    recipe.write_text(recipe.read_text().replace("method: fp8", "method: plugin-fp8"))
    broken = quantkit("quantize", recipe, "--out", tmp_path / "run", site=site, cache=session_cache)
    assert broken.returncode == 2, broken.stderr
    assert (
        "the method 'plugin-fp8' from quantkit-plugin-demo (quantkit_plugin_demo:PluginFP8Backend)"
        in broken.stderr
    )
    assert (
        "needs a library it lacks" in broken.stderr
        and "hint: reinstall quantkit-plugin-demo" in broken.stderr
    )


def _the_plugin_metric_and_stage_are_computed_gated_and_reported(run: Path, site: Path, cache: Path) -> None:
    """One registration each: ``HIGH_KLD`` gives a computed metric with its per-window series, a
    gate field and flag with a bootstrap interval; ``FileCountStage`` joins every quantize run,
    its typed result lands in its stage record and its metric in the manifest. Both are gated
    and reported, and a later ``bench RUN`` rebuilds the stage's result from its record."""
    manifest = json.loads((run / "manifest.json").read_text())
    value = manifest["metrics"]["quantized"]["high_kld_pct"]["value"]
    assert 0 < value < 100  # FP8 moves some positions past 1e-4 nats, not all
    series = json.loads((run / "eval_windows.json").read_text())["quantized"]["high_kld_pct"]
    assert abs(sum(series) / len(series) - value) < 1e-9  # equal windows: their mean is the metric
    files = len([path for path in (run / "artifact").rglob("*") if path.is_file()])
    assert manifest["schema_version"] == 3
    assert manifest["stages"]["artifact_files"]["result"] == {"seconds": 0.0, "files": files}
    assert manifest["metrics"]["quantized"]["artifact_files"]["value"] == files > 1

    args = ["--require-significance", "--format", "json"]
    low = ["--max-high-kld", f"{value / 2}%", "--max-artifact-files", files - 1]
    failed = quantkit("gate", run, *low, *args, site=site, cache=cache)
    assert failed.returncode == 1, failed.stderr
    checks = {c["metric"]: c for c in json.loads(failed.stdout)["runs"][0]["checks"]}
    assert checks["high_kld_pct"]["field"] == "max_high_kld_pct" and not checks["high_kld_pct"]["passed"]
    assert checks["high_kld_pct"]["interval"][0] <= value <= checks["high_kld_pct"]["interval"][1]
    assert (
        checks["artifact_files"]["field"] == "max_artifact_files" and not checks["artifact_files"]["passed"]
    )
    high = ["--max-high-kld", "100%", "--max-artifact-files", files]
    assert quantkit("gate", run, *high, *args, site=site, cache=cache).returncode == 0
    # negative control: without the package there is no such flag (a usage error)
    unknown = quantkit("gate", run, "--max-high-kld", "5%", site=None, cache=cache)
    assert unknown.returncode == 2 and "No such option: --max-high-kld" in unknown.stderr, unknown.stderr

    again = quantkit("bench", run, "--repeats", "1", site=site, cache=cache)
    assert again.returncode == 0, again.stderr[-2000:]
    updated = json.loads((run / "manifest.json").read_text())
    assert updated["stages"]["artifact_files"] == manifest["stages"]["artifact_files"]
    assert updated["metrics"]["quantized"]["artifact_files"]["value"] == files
    report = json.loads(quantkit("report", run, "--format", "json", site=site, cache=cache).stdout)
    assert {"high_kld_pct", "artifact_files"} <= set(report["columns"])
    assert report["rows"][1]["artifact_files"] == files
