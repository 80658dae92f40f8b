"""External runs are named from their paths, made unique (issue #39)."""

from __future__ import annotations

from pathlib import Path

from quantkit.inputs.external import ExternalArtifact, display_names


def _gguf(path: str) -> ExternalArtifact:
    return ExternalArtifact("gguf", Path(path), "gguf", "llamacpp", "Q4_K_M", None, (Path(path),))


def test_three_model_ggufs_are_named_by_their_folders(tmp_path: Path) -> None:
    names = display_names(
        [_gguf(f"{tmp_path}/{d}/model.gguf") for d in "abc"] + [_gguf(f"{tmp_path}/q8.gguf")]
    )
    assert names == ["a/model.gguf", "b/model.gguf", "c/model.gguf", "q8.gguf"]


def test_names_the_same_up_the_tree_get_deeper_then_a_number(tmp_path: Path) -> None:
    paths = [f"{tmp_path}/x/run/model.gguf", f"{tmp_path}/y/run/model.gguf", f"{tmp_path}/y/run/model.gguf"]
    assert display_names([_gguf(p) for p in paths]) == [
        "x/run/model.gguf",
        "y/run/model.gguf#1",
        "y/run/model.gguf#2",
    ]
    assert display_names([_gguf(f"{tmp_path}/only/model.gguf")]) == ["model.gguf"]
