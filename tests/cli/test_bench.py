"""Speed/memory stage and `quantkit bench` on the tiny model (structure, not speed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantkit.cli import main
from quantkit.evals import perf
from quantkit.inputs.specs import BenchSpec
from quantkit.results.manifest import BenchSection, BenchSide

SMALL = [
    "--set", "bench.prompt_lengths=[16, 32]", "--set", "bench.decode_tokens=4",
    "--set", "bench.repeats=1", "--set", "bench.batch_size=2",
]  # fmt: skip


def test_quantize_with_bench_records_speed_and_memory(tiny_recipe: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["quantize", str(tiny_recipe), "--out", str(out), "--bench", *SMALL]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    bench = manifest["bench"]
    assert bench["settings"]["prompt_lengths"] == [16, 32]
    for side in ("baseline", "artifact"):
        result = bench[side]
        assert set(result["prefill_tok_s"]) == {"16", "32"} and result["decode_tok_s"] > 0
        assert 0 < result["peak_memory_bytes"] < 2**31 and result["memory_kind"] == "rss"
        assert result["load_s"] > 0
        assert result["batched_decode_tok_s"] > 0
    quantized = manifest["metrics"]["quantized"]
    for name in ("prefill_tok_s", "decode_tok_s", "ttft_s", "decode_speed_ratio", "memory_ratio"):
        assert quantized[name]["value"] > 0, name
    assert quantized["decode_speed_ratio"]["higher_is_better"] is True
    assert manifest["metrics"]["baseline"]["decode_tok_s"]["value"] > 0
    assert "bench_s" in manifest["timings"]
    assert "cost_per_mtok_usd" not in quantized  # no price given
    # issue #39: the speed ratio comes with its reason, in the manifest and beside the table
    assert bench["notes"][0].startswith("FP8 runs emulated here: on the CPU transformers decompresses")
    err = " ".join(capsys.readouterr().err.split())
    assert "warning: tiny-fp8: FP8 runs emulated here" in err, err


def test_bench_command_updates_a_run_with_cost(tiny_recipe: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["quantize", str(tiny_recipe), "--out", str(out), "--no-bench", *SMALL]) == 0
    assert json.loads((out / "manifest.json").read_text())["bench"] is None
    capsys.readouterr()
    assert main(["bench", str(out), "--price-per-hour", "2.0", "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)[0]
    manifest = json.loads((out / "manifest.json").read_text())
    decode = manifest["bench"]["artifact"]["decode_tok_s"]
    assert (
        result["quantized"]["cost_per_mtok_usd"]
        == manifest["metrics"]["quantized"]["cost_per_mtok_usd"]["value"]
    )
    # batch-1 cost on both sides: $2/h over decode tok/s (the formula itself is tested below)
    assert manifest["metrics"]["quantized"]["cost_per_mtok_usd"]["value"] == perf.cost_per_mtok(2.0, decode)
    assert manifest["bench"]["settings"]["price_per_hour"] == 2.0
    assert manifest["recipe"]["bench"]["price_per_hour"] == 2.0  # the manifest says what measured it
    # the run is finalized like a quantize: its reports show the bench, its stage is recorded
    assert "decode tok/s" in (out / "report.md").read_text()
    assert "bench" in manifest["stages"] and manifest["gate"]["passed"] is True


def test_cost_per_million_tokens() -> None:
    assert perf.cost_per_mtok(2.0, 100.0) == pytest.approx(5.555556, rel=1e-6)  # $2/h at 100 tok/s
    assert perf.cost_per_mtok(4.5, 2500.0) == pytest.approx(0.5)


def _side(
    runtime: str, memory_kind: str, decode: float, peak: int, batched: float | None = None
) -> BenchSide:
    return BenchSide(
        runtime=runtime,
        load_s=1.0,
        prefill_tok_s={"16": 100.0, "32": 200.0},
        ttft_s={"16": 0.1, "32": 0.2},
        decode_tok_s=decode,
        rss_before_load_bytes=0,
        weights_memory_bytes=peak // 2,
        peak_memory_bytes=peak,
        memory_kind=memory_kind,
        threads=2,
        batched_decode_tok_s=batched,
        batch_size=None if batched is None else 4,
    )


def test_ratios_compare_like_with_like() -> None:
    """CUDA-allocated memory of transformers against llama.cpp's RSS is no ratio; cost is at
    batch 1 on both sides; the same-runtime ratios come from the unquantized model measured in
    the artifact's runtime."""
    spec = BenchSpec(prompt_lengths=[16, 32], price_per_hour=3.6)
    section = BenchSection(
        settings={},
        baseline=_side("hf", "cuda", 50.0, 2_000_000_000, batched=180.0),
        artifact=_side("llamacpp", "rss", 150.0, 500_000_000),
        runtime_baseline=_side("llamacpp", "rss", 100.0, 1_000_000_000),
    )
    base, quant, notes = perf.metrics_from(section, spec)
    assert "memory_ratio" not in quant and "weights_memory_ratio" not in quant
    assert any("no memory ratio" in note and "cuda" in note for note in notes)
    assert quant["decode_speed_ratio"] == pytest.approx(3.0)
    assert quant["runtime_decode_speed_ratio"] == pytest.approx(1.5)
    assert quant["runtime_memory_ratio"] == pytest.approx(0.5)
    assert base["cost_per_mtok_usd"] == pytest.approx(20.0) and quant["cost_per_mtok_usd"] == pytest.approx(
        20 / 3
    )
    assert base["batched_cost_per_mtok_usd"] == pytest.approx(3.6 / (180 * 3600) * 1e6)
    assert "batched_cost_per_mtok_usd" not in quant  # llama.cpp measured batch 1 only


def test_bench_on_a_folder_that_is_not_a_run(tmp_path: Path, capsys) -> None:
    assert main(["bench", str(tmp_path)]) == 2


def test_peak_memory_is_the_workers_own_not_its_parents(tiny_model: Path) -> None:
    """The workers are started by the quantize process, which may hold GBs; their peak must
    not include it (ru_maxrss is inherited across fork+exec on Linux; VmHWM is not)."""
    ballast = bytearray(1_500_000_000)  # the parent's resident memory
    ballast[::4096] = b"\x01" * len(ballast[::4096])
    spec = BenchSpec(prompt_lengths=[16], decode_tokens=4, repeats=1, batch_size=1)
    target = perf.BenchTarget(tiny_model, "hf")
    section = perf.measure(target, target, None, "cpu", spec)
    del ballast
    for side in (section.baseline, section.artifact):
        assert 0 < side.peak_memory_bytes < 500_000_000, side
        assert side.peak_memory_bytes >= side.weights_memory_bytes


def test_the_workers_use_the_threads_omp_num_threads_allows(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job sharing the machine caps its threads with OMP_NUM_THREADS; the bench workers (and
    llama.cpp, which does not read it itself) take every core otherwise."""
    import os

    spec = BenchSpec(prompt_lengths=[16], decode_tokens=2, repeats=1, batch_size=1)
    settings = perf.worker_settings(perf.BenchTarget(tiny_model, "hf"), "cpu", spec)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert perf._worker(settings).threads == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert perf._worker(settings).threads == os.cpu_count()


@pytest.mark.parametrize(("value", "expected"), [("1", 1), ("3", 3), ("0", None), ("x", None), ("", None)])
def test_cpu_threads_reads_omp_num_threads(value: str, expected: int | None, monkeypatch) -> None:
    import os

    from quantkit.device import cpu_threads

    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert cpu_threads() == (expected or os.cpu_count())
