"""`quantkit sensitivity` (per layer / tensor class profile) and `quantkit search` (the smallest
GGUF per-tensor or GPTQ per-layer mix that meets a quality budget)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

import typer

from quantkit.cli.common import FormatOption, VerboseOption, device_option, device_value
from quantkit.cli.output import OutputFormat, RichReporter, emit_json, stderr, stdout
from quantkit.device import DeviceChoice

if TYPE_CHECKING:
    from quantkit.search.profile import SearchFormat

ModelOption = typer.Option(None, "--model", "-m", help="HF folder, hub id, .gguf file, or smollm2-135m")
FormatsOption = typer.Option(
    "gguf", "--formats", help="formats to profile / search: gguf, gptq, awq or several (gguf,gptq)"
)
SetOption = typer.Option(
    [], "--set", "-s", help="eval/calibration/device settings: key.sub=value (eval.num_windows=8)"
)


def _formats(value: str) -> list[SearchFormat]:
    from quantkit.search.driver import check_request

    formats = [item.strip().lower() for item in value.split(",") if item.strip()]
    check_request(formats, "size", len(formats))
    return cast("list[SearchFormat]", formats)


def sensitivity(
    model: str | None = ModelOption,
    formats: str = FormatsOption,
    base: str | None = typer.Option(
        None, "--base", help="type of everything but the part measured (gguf: Q8_0; gptq, awq: W8)"
    ),
    low: str | None = typer.Option(
        None, "--low", help="the candidate low precision of the part measured (gguf: Q4_0; gptq, awq: W4)"
    ),
    proxy_only: bool = typer.Option(
        False, "--proxy-only", help="only the weight-error proxy (no evaluation per part)"
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="folder for sensitivity.json and sensitivity.html"
    ),
    overrides: list[str] = SetOption,
    device: DeviceChoice | None = device_option("auto"),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="allow model code"),
    output_format: OutputFormat = FormatOption,
    verbose: bool = VerboseOption,
) -> None:
    """KLD increase per decoder layer and tensor class when only that part is quantized low, for
    each format (GGUF types in llama.cpp; GPTQ's integer bits in transformers)."""
    from quantkit.report.sensitivity import profile_html, profile_table
    from quantkit.search.profile import (
        DEFAULT_TYPES,
        Profile,
        ProfileRequest,
        build_profile,
        check_types,
        profile_recipe,
    )
    from quantkit.util.fileio import write_text_atomic
    from quantkit.util.library_log import LIBRARY_LOG, LOG_NAME
    from quantkit.util.progress import Reporter, library_bars_hidden, quiet_libraries

    chosen = _formats(formats)
    types = {
        fmt: ((base or DEFAULT_TYPES[fmt][0]).upper(), (low or DEFAULT_TYPES[fmt][1]).upper())
        for fmt in chosen
    }
    for fmt, (fmt_base, fmt_low) in types.items():
        check_types(fmt_base, fmt_low, fmt)
    recipe = profile_recipe(model, overrides, device_value(device), types.get("gguf", ("Q8_0",))[0])
    human = output_format == OutputFormat.human
    profiles: list[Profile] = []
    quiet_libraries(verbose)
    mark = LIBRARY_LOG.begin_run()
    for fmt, (fmt_base, fmt_low) in types.items():
        request = ProfileRequest(recipe, fmt_base, fmt_low, not proxy_only, trust_remote_code, fmt)
        with library_bars_hidden(verbose):
            profiles.append(build_profile(request, RichReporter() if human else Reporter()))
    names = ["sensitivity.json"] if len(profiles) == 1 else [f"sensitivity-{p.format}.json" for p in profiles]
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for name, profile in zip(names, profiles, strict=True):
            write_text_atomic(out / name, profile.model_dump_json(indent=1))
        write_text_atomic(out / "sensitivity.html", profile_html(profiles))
        write_text_atomic(out / LOG_NAME, LIBRARY_LOG.run_text(mark))
    if not human:
        dumps = [p.model_dump(mode="json", exclude={"tensors"}) for p in profiles]
        emit_json(dumps[0] if len(dumps) == 1 else {"profiles": dumps})
        return
    for profile in profiles:
        stdout.print(profile_table(profile))
        cost = profile.cost
        line = f"{profile.format} proxy: {cost['proxy_forward_passes']} forward passes (calibration), "
        line += f"{cost['proxy_s']} s"
        if "measured_evaluations" in cost:
            line += (
                f"; measured: {cost['measured_evaluations']} evaluations = "
                f"{cost['measured_forward_passes']} forward passes, {cost['measured_s']} s; "
                f"Spearman proxy vs measured: {profile.spearman}"
            )
        stderr.print(line)
    if out is not None:
        stderr.print(f"profile saved to [bold]{out}[/bold] ({', '.join(names)}, sensitivity.html)")


def search(
    model: str | None = ModelOption,
    formats: str = FormatsOption,
    max_kld: float | None = typer.Option(None, "--max-kld", help="quality budget: mean KLD (nats)"),
    max_ppl_increase: str | None = typer.Option(
        None, "--max-ppl-increase", help="quality budget: perplexity increase, e.g. 3%"
    ),
    objective: str = typer.Option(
        "size",
        "--objective",
        help="what the winner is best at: size (bits per weight), decode (measured tokens/s) or "
        "memory (measured peak bytes)",
    ),
    max_candidates: int = typer.Option(6, "--max-candidates", help="candidates evaluated at most"),
    seed: int = typer.Option(0, "--seed", help="seed of the path's tie-breaking"),
    profile: list[Path] = typer.Option(
        [], "--profile", help="a sensitivity.json (measured) to calibrate the proxy with; one per format"
    ),
    out: Path | None = typer.Option(None, "--out", "-o", help="the search folder (default runs/search)"),
    overrides: list[str] = SetOption,
    device: DeviceChoice | None = device_option("auto"),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="allow model code"),
    output_format: OutputFormat = FormatOption,
    verbose: bool = VerboseOption,
) -> None:
    """The GGUF per-tensor (or GPTQ per-layer) mix that meets a quality budget at the least size
    (or the fastest decode, or the least memory, measured), its candidates evaluated as a sweep."""
    from quantkit.cli.gate import _percent
    from quantkit.cli.sweep_view import RichSweepView
    from quantkit.paths import runs_dir
    from quantkit.search.driver import SearchRequest, budget_from, check_request, run_search
    from quantkit.search.profile import profile_recipe
    from quantkit.search.record import Objective
    from quantkit.sweep.driver import SilentView
    from quantkit.util.progress import Reporter

    searched = _formats(formats)
    check_request(searched, objective, max_candidates)
    budget = budget_from(max_kld, _percent(max_ppl_increase, "--max-ppl-increase"))
    recipe = profile_recipe(model, overrides, device_value(device))
    folder = (out if out is not None else runs_dir() / "search").resolve()
    request = SearchRequest(
        recipe,
        budget,
        folder,
        max_candidates,
        seed,
        profile,
        trust_remote_code=trust_remote_code,
        objective=cast("Objective", objective),
        formats=searched,
        verbose=verbose,
    )
    human = output_format == OutputFormat.human
    result = run_search(
        request, RichReporter() if human else Reporter(), RichSweepView() if human else SilentView()
    )
    record = result.record
    if not human:
        emit_json({"search": str(result.folder), "record": record.model_dump(mode="json")})
    else:
        from quantkit.report.sensitivity import candidates_table

        stdout.print(candidates_table(record))
        stderr.print(record.why)
        if record.chosen:
            stderr.print(
                f"chosen recipe: [bold]{folder / 'chosen-recipe.yaml'}[/bold]; artifact: "
                f"{folder / 'sweep' / 'runs' / record.chosen / 'artifact'}; report: {folder / 'report.html'}"
            )
    if result.exit_code:
        if human and not record.chosen:
            stderr.print("[red]error:[/red] " + record.why)
            stderr.print("hint: raise the budget, or allow more --max-candidates")
        raise typer.Exit(result.exit_code)
