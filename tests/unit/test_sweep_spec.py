"""The sweep spec: file and command-line forms, grid expansion, names, ids, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantkit.errors import RecipeError
from quantkit.sweep.spec import SweepFlags, expand, parse_grid, spec_from_command


def command(*items: str, grid: tuple[str, ...] = (), overrides: tuple[str, ...] = ()):
    return spec_from_command(list(items), SweepFlags(grid=list(grid), overrides=list(overrides)))


def test_a_cartesian_grid_becomes_one_named_run_per_point() -> None:
    spec = command(
        "gptq-w4a16-g128",
        grid=("options.group_size=32,64,128", "options.dampening_frac=0.01,0.1"),
        overrides=("eval.num_windows=3",),
    )
    runs = expand(spec)
    assert [run.name for run in runs] == [
        f"gptq-w4a16-g128 [group_size={g}, dampening_frac={d}]" for g in (32, 64, 128) for d in (0.01, 0.1)
    ]
    assert runs[0].run_id == "gptq-w4a16-g128-group_size=32-dampening_frac=0.01"
    assert [(run.recipe.options["group_size"], run.recipe.options["dampening_frac"]) for run in runs] == [
        (g, d) for g in (32, 64, 128) for d in (0.01, 0.1)
    ]
    assert {run.recipe.eval.num_windows for run in runs} == {3}


def test_a_sweep_file_shares_eval_gates_and_grids_and_keeps_ids_stable(tmp_path: Path) -> None:
    path = tmp_path / "4bit.yaml"
    path.write_text(
        """
recipes:
  - fp8-dynamic
  - recipe: rtn-w4a16-g64
    grid: {options.group_size: [32, 64]}
models: [smollm2-135m, ./other]
eval: {num_windows: 4, seq_len: 128}
gates: {max_kld_mean: 0.5}
device: cpu
""",
        encoding="utf-8",
    )
    spec = spec_from_command([str(path)], SweepFlags())
    runs = expand(spec)
    assert [run.run_id for run in runs] == [
        "fp8-dynamic-1",
        "rtn-w4a16-g64-group_size=32-1",
        "rtn-w4a16-g64-group_size=64-1",
        "fp8-dynamic-2",
        "rtn-w4a16-g64-group_size=32-2",
        "rtn-w4a16-g64-group_size=64-2",
    ]
    assert [run.model for run in runs] == ["smollm2-135m"] * 3 + ["./other"] * 3
    for run in runs:
        assert (run.recipe.eval.num_windows, run.recipe.eval.seq_len) == (4, 128)
        assert run.recipe.gates.max_kld_mean == 0.5 and run.recipe.device == "cpu"
    # adding a recipe keeps the ids of the others (a rerun finds their folders)
    spec2 = spec.model_copy(
        update={"recipes": [*spec.recipes[:1], *spec_from_command([str(path)], SweepFlags()).recipes]}
    )
    with pytest.raises(RecipeError, match="are the same recipe on the same model"):
        expand(spec2)


@pytest.mark.parametrize(
    ("items", "grid", "message"),
    [
        (("gptq-w4a16-g129",), (), "recipe 'gptq-w4a16-g129' not found"),
        (("gptq-w4a16-g128",), ("options.group_sise=32,64",), "unknown field 'options.group_sise'"),
        (("gptq-w4a16-g128",), ("nosuch.key=1,2",), "unknown field 'nosuch'"),
        (("gptq-w4a16-g128",), ("options.group_size=",), "grid 'options.group_size' has no values"),
        (("gptq-w4a16-g128",), ("options.group_size=32,32",), "repeats a value"),
        (("gptq-w4a16-g128",), ("group_size",), "bad grid 'group_size'"),
        (("fp8-dynamic", "fp8-dynamic"), (), "are the same recipe on the same model"),
    ],
)
def test_bad_sweeps_are_refused_naming_the_problem(
    items: tuple[str, ...], grid: tuple[str, ...], message: str
) -> None:
    with pytest.raises(RecipeError, match=message):
        expand(command(*items, grid=grid))


def test_sweep_file_errors_name_the_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("recipes: [fp8-dynamic]\nexecuter: ray\n", encoding="utf-8")
    with pytest.raises(RecipeError, match=r"s.yaml: unknown field 'executer'") as err:
        spec_from_command([str(path)], SweepFlags())
    assert "executor" in err.value.hint
    path.write_text("recipes: []\n", encoding="utf-8")
    with pytest.raises(RecipeError, match=r"s.yaml: invalid value for 'recipes'"):
        spec_from_command([str(path)], SweepFlags())
    path.write_text("recipes: [fp8-dynamic]\nray: {adress: auto}\n", encoding="utf-8")
    with pytest.raises(RecipeError, match=r"unknown field 'ray.adress'"):
        spec_from_command([str(path)], SweepFlags())


def test_grid_values_are_yaml_scalars() -> None:
    assert parse_grid(["options.group_size=32, 64", "options.actorder=true,false", "x=null,a"]) == {
        "options.group_size": [32, 64],
        "options.actorder": [True, False],
        "x": [None, "a"],
    }


@pytest.mark.parametrize(
    ("ray", "on_gpu", "expected"),
    [
        ({}, False, (1.0, 0.0, 1)),  # a CPU per run, one torch thread
        ({}, True, (0.0, 1.0, None)),  # a GPU per run ('auto' on a cluster with GPUs)
        ({"num_cpus": 4}, False, (4.0, 0.0, 4)),
        ({"num_gpus": 0.5, "num_cpus": 2}, True, (2.0, 0.5, None)),
    ],
)
def test_ray_task_resources_follow_the_device_unless_given(
    ray: dict[str, float], on_gpu: bool, expected: tuple[float, float, int | None], tmp_path: Path
) -> None:
    from quantkit.sweep.executors.ray import RayExecutor
    from quantkit.sweep.spec import SweepSpec

    executor = RayExecutor(SweepSpec(recipes=["fp8-dynamic"], executor="ray", ray=ray), tmp_path)
    executor._resources(on_gpu)
    assert (executor.num_cpus, executor.num_gpus, executor.threads()) == expected
