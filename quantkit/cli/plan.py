"""`quantkit plan RECIPE`: memory estimate per format before any heavy work."""

from __future__ import annotations

from pathlib import Path

import typer

from quantkit.cli.common import FormatOption
from quantkit.cli.output import OutputFormat, emit_json, stdout


def plan(
    recipe: str = typer.Argument("fp8-dynamic", help="recipe file or shipped name"),
    model: str | None = typer.Option(
        None, "--model", "-m", help="HF folder, hub id, .gguf file (or org/name:file.gguf), or smollm2-135m"
    ),
    context: int = typer.Option(4096, "--context", min=1, help="tokens of KV cache per sequence"),
    batch: int = typer.Option(1, "--batch", min=1, help="concurrent sequences"),
    device_name: str = typer.Option(
        "auto",
        "--device-name",
        help="auto (this machine) or a named device: l4, a100-80gb, h100-80gb, h200, ...",
    ),
    overrides: list[str] = typer.Option([], "--set", "-s", help="override a recipe field: key.sub=value"),
    trust_remote_code: bool = typer.Option(
        False, "--trust-remote-code", help="allow a model folder that needs its own code"
    ),
    output_format: OutputFormat = FormatOption,
) -> None:
    """Estimate weights and KV-cache memory for the recipe's format and whether it fits a device."""
    from rich.table import Table

    from quantkit.errors import UserInputError
    from quantkit.inputs import plan as planning
    from quantkit.inputs.models import resolve_model
    from quantkit.inputs.recipe import load_recipe
    from quantkit.registry import did_you_mean

    resolved = load_recipe(recipe, overrides)
    scheme, bits = resolved.backend().describe()
    source = resolve_model(model or resolved.model, trust_remote_code=trust_remote_code)
    if device_name == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        memory: int | None = planning.machine_memory(device)
    elif device_name in planning.DEVICE_MEMORY:
        device, memory = device_name, planning.DEVICE_MEMORY[device_name]
    else:
        raise UserInputError(
            f"unknown device '{device_name}'", did_you_mean(device_name, sorted(planning.DEVICE_MEMORY))
        )
    from quantkit.backends.autoround import AutoRoundGGUFOptions
    from quantkit.backends.gguf import GGUFOptions

    backend = resolved.backend()
    backend.check_weights(source.path)
    gguf = backend.options if isinstance(backend.options, GGUFOptions) else None
    gguf_type: str | None = None if gguf is None else gguf.type
    if isinstance(backend.options, AutoRoundGGUFOptions):  # AutoRound's GGUF: llama.cpp's type rules
        from quantkit.backends.gguf import NOMINAL_BITS

        kind = backend.options.format.removeprefix("gguf:").upper()
        gguf_type = kind if kind in NOMINAL_BITS else None  # Q4_1, Q5_1: nominal bits only
    target = planning.Target(
        scheme,
        bits,
        gguf_type=gguf_type,
        imatrix=gguf is not None and gguf.imatrix,
        gguf_overrides=None if gguf is None else gguf.overrides(),
        module_bits=_module_bits(backend.options, source.path),
    )
    result = planning.estimate(source.path, target, planning.Serving(context, batch, device, memory))
    if output_format == OutputFormat.json:
        emit_json(result.to_dict() | {"recipe": resolved.name, "model": source.spec})
        return
    gib = planning.GIB
    table = Table(title=f"plan: {resolved.name} ({scheme}) on {source.spec}")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("parameters", f"{result.parameters / 1e6:,.1f} M")
    table.add_row("baseline weights (as stored)", f"{result.baseline_weights_bytes / gib:.3f} GiB")
    table.add_row(f"quantized weights (~{bits:g} bits)", f"{result.quantized_weights_bytes / gib:.3f} GiB")
    table.add_row(f"KV cache ({context} tok x {batch})", f"{result.kv_cache_bytes / gib:.3f} GiB")
    table.add_row("serving total", f"{result.serving_bytes / gib:.3f} GiB")
    table.add_row(f"{device} memory", "—" if memory is None else f"{memory / gib:.1f} GiB")
    table.add_row("fits", {True: "[green]yes[/green]", False: "[red]no[/red]", None: "?"}[result.fits])
    stdout.print(table)


def _module_bits(options: object, model_path: Path) -> dict[str, float] | None:
    """Per-layer bits when an integer recipe has per-layer overrides."""
    from quantkit.backends.int_weights import IntWeightOptions

    if not isinstance(options, IntWeightOptions) or not options.overrides:
        return None
    from quantkit.inputs.plan import tensor_shapes

    return options.bits_per_module(tensor_shapes(model_path))
