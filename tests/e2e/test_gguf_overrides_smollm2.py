"""Per-tensor GGUF types on the real SmolLM2-135M: llama.cpp writes what the recipe asks for,
`quantkit plan` predicts every tensor's type, and the file grows by exactly the bytes asked."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import require_extra

from quantkit.cli import main

pytestmark = pytest.mark.slow

require_extra("llama_cpp", "gguf")

# eval on 4 x 128 tokens, no bench: the runs only need a KLD and a file
BUDGET = ["--set", "eval.num_windows=4", "--set", "eval.seq_len=128", "--no-bench", "--device", "cpu"]
LAYERS = 30


@pytest.fixture(scope="module")
def runs(session_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    os.environ["QUANTKIT_CACHE"] = str(session_cache)
    root = tmp_path_factory.mktemp("gguf-overrides")
    manifests = {}
    for recipe in ("gguf-q4_k_m", "gguf-q4_k_m-ffn-down-q8"):
        out = root / recipe
        assert main(["quantize", recipe, "--out", str(out), *BUDGET]) == 0
        manifests[recipe] = json.loads((out / "manifest.json").read_text()) | {"_path": str(out)}
    return manifests


def written_types(run: dict) -> dict[str, str]:
    import gguf

    reader = gguf.GGUFReader(Path(run["_path"]) / "artifact" / "model.gguf")
    return {tensor.name: tensor.tensor_type.name for tensor in reader.tensors}


def test_every_ffn_down_is_q8_0_and_nothing_else_changes(runs: dict[str, dict]) -> None:
    plain, mixed = (written_types(runs[name]) for name in ("gguf-q4_k_m", "gguf-q4_k_m-ffn-down-q8"))
    down = {f"blk.{i}.ffn_down.weight" for i in range(LAYERS)}
    assert {name: kind for name, kind in mixed.items() if name in down} == dict.fromkeys(down, "Q8_0")
    # Q4_K_M's own mix: the more-bits layers' ffn_down at Q6_K, the rest at Q4_K (1536-wide rows fit)
    assert sorted(plain[name] for name in down) == ["Q4_K"] * 16 + ["Q6_K"] * 14
    assert {n: k for n, k in mixed.items() if n not in down} == {
        n: k for n, k in plain.items() if n not in down
    }


def test_the_file_grows_by_exactly_the_bytes_of_the_overridden_tensors(runs: dict[str, dict]) -> None:
    """576 x 1536 weights per ffn_down: Q8_0 34 bytes per 32, Q6_K 210 per 256, Q4_K 144 per 256."""
    plain, mixed = runs["gguf-q4_k_m"], runs["gguf-q4_k_m-ffn-down-q8"]
    elements = 576 * 1536
    growth = 16 * elements * (34 / 32 - 144 / 256) + 14 * elements * (34 / 32 - 210 / 256)
    size = {name: run["artifact"]["details"]["file_bytes"] for name, run in runs.items()}
    assert size["gguf-q4_k_m-ffn-down-q8"] - size["gguf-q4_k_m"] == growth == 10_077_696
    bpw = {name: run["artifact"]["details"]["bits_per_weight"] for name, run in runs.items()}
    print(f"sizes {size}, bits per weight {bpw}")
    assert bpw["gguf-q4_k_m-ffn-down-q8"] > bpw["gguf-q4_k_m"]
    # the label says what the file holds (#39): Q4_K_M's preset for the plain file, "mixed" with
    # each type's share of the quantized weights for the other
    assert plain["artifact"]["scheme"] == "Q4_K_M"
    shares = mixed["artifact"]["details"]["type_shares_pct"]
    assert abs(sum(shares.values()) - 100) < 0.5 and shares["Q8_0"] > plain["artifact"]["details"][
        "type_shares_pct"
    ].get("Q8_0", 0)
    top = sorted(shares, key=shares.get, reverse=True)[:2]
    assert mixed["artifact"]["scheme"].startswith(f"mixed {top[0]} {shares[top[0]]:.0f}% {top[1]} "), mixed[
        "artifact"
    ]["scheme"]


def test_more_bits_on_ffn_down_do_not_raise_the_kld(runs: dict[str, dict]) -> None:
    kld = {name: run["metrics"]["quantized"]["kld_mean"]["value"] for name, run in runs.items()}
    print(f"KLD {kld}")
    assert kld["gguf-q4_k_m-ffn-down-q8"] <= kld["gguf-q4_k_m"]
    assert len({run["eval"]["reference_key"] for run in runs.values()}) == 1  # the same eval tokens


def test_the_manifest_records_what_each_override_took_and_what_llama_cpp_wrote(runs: dict[str, dict]) -> None:
    mixed = runs["gguf-q4_k_m-ffn-down-q8"]
    assert mixed["recipe"]["options"]["tensor_types"] == {"ffn_down": "Q8_0"}
    assert mixed["artifact"]["details"]["overrides"] == [
        {
            "option": "tensor_types",
            "pattern": "ffn_down",
            "type": "Q8_0",
            "tensors": [f"blk.{i}.ffn_down.weight" for i in range(LAYERS)],
            "written": {"Q8_0": LAYERS},
        }
    ]
    histogram = mixed["artifact"]["details"]["tensor_types"]
    assert histogram == {"F32": 61, "Q5_0": 166, "Q8_0": 45}
    assert "overrides" not in runs["gguf-q4_k_m"]["artifact"]["details"]


# options -> what the plan must predict, checked against files llama.cpp writes (no eval)
PLANS = {
    "ffn_down to Q8_0": {"type": "Q4_K_M", "tensor_types": {"ffn_down": "Q8_0"}},
    # three ffn_down and the last ten attn_v taken by patterns do not advance Q4_K_M's counters:
    # the more-bits layers of the others shift
    "counters skip taken tensors": {
        "type": "Q4_K_M",
        "tensor_types": {
            "blk\\.(0|1|2)\\.ffn_down": "Q8_0",
            "blk\\.2[0-9]\\.attn_v": "IQ4_NL",
            "attn_q": "Q4_0",
        },
    },
    "tied output type and a pattern on the embedding": {
        "type": "Q5_K_M",
        "tensor_types": {"ffn_down": "Q5_K", "blk\\.1[0-9]\\.ffn_up": "Q8_0"},
        "output_tensor_type": "Q5_0",
    },
    "token embedding type": {
        "type": "Q6_K",
        "token_embedding_type": "Q4_0",
        "tensor_types": {"attn_k": "Q5_1"},
    },
    "Q3_K_M falls back to Q4_0": {"type": "Q3_K_M"},
}


@pytest.mark.parametrize("case", list(PLANS))
def test_plan_predicts_every_tensor_type_llama_cpp_writes(
    case: str, smollm2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import gguf

    from quantkit.backends.base import QuantizeJob
    from quantkit.inputs.plan import gguf_tensor_types
    from quantkit.inputs.recipe import validate_recipe

    recipe = validate_recipe({"name": "mixed", "method": "gguf", "options": PLANS[case]})
    backend = recipe.backend()
    backend.check_weights(smollm2)
    backend.quantize(QuantizeJob(smollm2, tmp_path / "artifact", "cpu", 0))
    path = tmp_path / "artifact" / "model.gguf"
    written = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors if len(t.shape) > 1}
    options = backend.options
    predicted = gguf_tensor_types(smollm2, options.type, options.imatrix, options.overrides())  # type: ignore[attr-defined]
    assert {tensor.name: kind for tensor, kind in predicted if len(tensor.ne) > 1} == written
    recipe_file = tmp_path / "mixed.yaml"
    recipe_file.write_text(recipe.to_yaml())
    capsys.readouterr()
    assert main(["plan", str(recipe_file), "--model", str(smollm2), "--format", "json"]) == 0
    estimate = json.loads(capsys.readouterr().out)["quantized_weights_bytes"]
    assert estimate == pytest.approx(path.stat().st_size, rel=0.01)
