"""`quantkit sensitivity` (per layer / tensor class profile) and `quantkit search` (the smallest
GGUF per-tensor mix that meets a quality budget)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import typer

from quantkit.cli.common import FormatOption, device_option, device_value
from quantkit.cli.output import OutputFormat, RichReporter, emit_json, stderr, stdout
from quantkit.device import DeviceChoice

ModelOption = typer.Option(None, "--model", "-m", help="HF folder, hub id, .gguf file, or smollm2-135m")
FormatsOption = typer.Option("gguf", "--formats", help="formats to profile / search (gguf)")
SetOption = typer.Option(
    [], "--set", "-s", help="eval/calibration/device settings: key.sub=value (eval.num_windows=8)"
)


def _formats(value: str) -> list[str]:
    from quantkit.search.driver import check_request

    formats = [item.strip().lower() for item in value.split(",") if item.strip()]
    check_request(formats, "size", 1)
    return formats


def sensitivity(
    model: str | None = ModelOption,
    formats: str = FormatsOption,
    base: str = typer.Option("Q8_0", "--base", help="type of everything but the part measured"),
    low: str = typer.Option("Q4_0", "--low", help="the candidate low precision of the part measured"),
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
) -> None:
    """KLD increase per decoder layer and tensor class when only that part is quantized low."""
    from quantkit.fileio import write_text_atomic
    from quantkit.progress import Reporter
    from quantkit.report.sensitivity import profile_html, profile_table
    from quantkit.search.profile import ProfileRequest, build_profile, check_types, profile_recipe

    _formats(formats)
    base, low = base.upper(), low.upper()
    check_types(base, low)
    recipe = profile_recipe(model, overrides, device_value(device), base)
    human = output_format == OutputFormat.human
    request = ProfileRequest(recipe, base, low, not proxy_only, trust_remote_code)
    profile = build_profile(request, RichReporter() if human else Reporter())
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "sensitivity.json", profile.model_dump_json(indent=1))
        write_text_atomic(out / "sensitivity.html", profile_html(profile))
    if not human:
        emit_json(profile.model_dump(mode="json", exclude={"tensors"}))
        return
    stdout.print(profile_table(profile))
    cost = profile.cost
    line = f"proxy: {cost['proxy_forward_passes']} forward passes (calibration), {cost['proxy_s']} s"
    if "measured_evaluations" in cost:
        line += (
            f"; measured: {cost['measured_evaluations']} evaluations = {cost['measured_forward_passes']} "
            f"forward passes, {cost['measured_s']} s; Spearman proxy vs measured: {profile.spearman}"
        )
    stderr.print(line)
    if out is not None:
        stderr.print(f"profile saved to [bold]{out}[/bold] (sensitivity.json, sensitivity.html)")


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
    profile: Path | None = typer.Option(
        None, "--profile", help="a sensitivity.json (measured) to calibrate the proxy with"
    ),
    out: Path | None = typer.Option(None, "--out", "-o", help="the search folder (default runs/search)"),
    overrides: list[str] = SetOption,
    device: DeviceChoice | None = device_option("auto"),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="allow model code"),
    output_format: OutputFormat = FormatOption,
) -> None:
    """The GGUF per-tensor mix that meets a quality budget at the least size (or the fastest
    decode, or the least memory, measured), its candidates evaluated as a sweep."""
    from quantkit.cli.gate import _percent
    from quantkit.cli.sweep_view import RichSweepView
    from quantkit.paths import runs_dir
    from quantkit.progress import Reporter
    from quantkit.search.driver import Objective, SearchRequest, budget_from, check_request, run_search
    from quantkit.search.profile import profile_recipe
    from quantkit.sweep.driver import SilentView

    check_request(_formats(formats), objective, max_candidates)
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
