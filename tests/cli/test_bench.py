"""Speed/memory stage and `quantkit bench` on the tiny model (structure, not speed)."""

from __future__ import annotations

import json
from pathlib import Path

from quantkit.cli import main

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
        assert result["peak_memory_bytes"] >= 0 and result["load_s"] > 0 and result["memory_kind"] == "rss"
        assert result["batched_decode_tok_s"] > 0
    quantized = manifest["metrics"]["quantized"]
    for name in ("prefill_tok_s", "decode_tok_s", "ttft_s", "decode_speed_ratio", "memory_ratio"):
        assert quantized[name]["value"] > 0, name
    assert quantized["decode_speed_ratio"]["higher_is_better"] is True
    assert manifest["metrics"]["baseline"]["decode_tok_s"]["value"] > 0
    assert "bench_s" in manifest["timings"]
    assert "cost_per_mtok_usd" not in quantized  # no price given


def test_bench_command_updates_a_run_with_cost(tiny_recipe: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["quantize", str(tiny_recipe), "--out", str(out), "--no-bench", *SMALL]) == 0
    assert json.loads((out / "manifest.json").read_text())["bench"] is None
    capsys.readouterr()
    assert main(["bench", str(out), "--price-per-hour", "2.0", "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)[0]
    assert result["quantized"]["cost_per_mtok_usd"] > 0
    manifest = json.loads((out / "manifest.json").read_text())
    throughput = max(result["quantized"]["batched_decode_tok_s"], result["quantized"]["decode_tok_s"])
    expected = 2.0 / (throughput * 3600) * 1e6
    assert abs(manifest["metrics"]["quantized"]["cost_per_mtok_usd"]["value"] - expected) < 1e-9 * expected
    assert manifest["bench"]["settings"]["price_per_hour"] == 2.0


def test_bench_on_a_folder_that_is_not_a_run(tmp_path: Path, capsys) -> None:
    assert main(["bench", str(tmp_path)]) == 2


def test_peak_memory_is_the_workers_own_not_its_parents(tiny_model: Path) -> None:
    """The workers are started by the quantize process, which may hold GBs; their peak must
    not include it (ru_maxrss is inherited across fork+exec on Linux; VmHWM is not)."""
    from quantkit.bench_spec import BenchSpec
    from quantkit.evals import perf

    ballast = bytearray(1_500_000_000)  # the parent's resident memory
    ballast[::4096] = b"\x01" * len(ballast[::4096])
    spec = BenchSpec(prompt_lengths=[16], decode_tokens=4, repeats=1, batch_size=1)
    section = perf.measure_pair(tiny_model, tiny_model, "hf", "cpu", spec)
    del ballast
    for side in ("baseline", "artifact"):
        assert 0 < section[side]["peak_memory_bytes"] < 500_000_000, section[side]
        assert section[side]["peak_memory_bytes"] >= section[side]["weights_memory_bytes"]
