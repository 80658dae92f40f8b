"""`quantkit search`: the smallest GGUF per-tensor (or GPTQ per-layer) mix that meets a quality budget.

For each format searched (``gguf``, ``gptq``, ``awq``):

1. A sensitivity profile: the proxy (one pass over the calibration windows), or a saved
   ``quantkit sensitivity`` profile (its measured units calibrate the proxy).
2. The greedy demotion path (``quantkit.search.mix``): from every tensor at ``base`` to every
   tensor at the fewest bits, the least sensitive bits first.
3. Candidates on the path evaluated for real as one sweep (one baseline reference, shared by
   every format; ``max_candidates`` split evenly between the formats): the first at
   the predicted budget crossing, then by secant/bisection between the furthest point that met
   the budget and the nearest that did not, until they are adjacent on the path (the frontier),
   their sizes differ by less than ``tolerance_bpw``, or ``max_candidates`` were evaluated.
4. The winner (the best at the objective among those that met the budget, over every format;
   sizes are the files' bits per parameter) and its recipe YAML.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import JsonValue

from quantkit.errors import RecipeError, UserInputError
from quantkit.metrics import metric_info
from quantkit.search.profile import DEFAULT_TYPES, SearchFormat
from quantkit.search.record import (
    FORMATS,
    OBJECTIVE_TERMS,
    OBJECTIVES,
    Budget,
    Candidate,
    FormatPath,
    Objective,
    SearchRecord,
)

if TYPE_CHECKING:
    from quantkit.inputs.recipe import Recipe
    from quantkit.search.mix import Path as DemotionPath
    from quantkit.search.profile import Profile
    from quantkit.sweep.driver import SweepResult, SweepView
    from quantkit.util.progress import Reporter


@dataclass
class SearchRequest:
    """What ``quantkit search`` was asked; ``recipe`` carries the eval/calibration/device settings."""

    recipe: Recipe
    budget: Budget
    out: Path
    max_candidates: int = 6
    seed: int = 0
    profiles: list[Path] = field(default_factory=list)
    tolerance_bpw: float = 0.02
    trust_remote_code: bool = False
    objective: Objective = "size"
    formats: list[SearchFormat] = field(default_factory=lambda: ["gguf"])
    verbose: bool = False  # library output on the terminal (otherwise in library.log)


@dataclass
class SearchResult:
    folder: Path
    record: SearchRecord
    exit_code: int = 0
    extras: dict[str, JsonValue] = field(default_factory=dict)


def check_request(formats: Sequence[str], objective: str, max_candidates: int) -> None:
    """Refuse what the search does not cover before anything runs."""
    unknown = [name for name in formats if name not in FORMATS]
    if unknown:
        raise UserInputError(
            f"the search covers GGUF per-tensor and GPTQ/AWQ per-layer mixes, not {', '.join(unknown)}",
            "use --formats gguf, gptq, awq or several (gguf,gptq); FP8 mixes are not searched",
        )
    if not formats or len(set(formats)) != len(formats):
        raise UserInputError(
            f"--formats {','.join(formats)} names no format or one twice", "e.g. --formats gguf,gptq"
        )
    if objective not in OBJECTIVES:
        raise UserInputError(
            f"unknown objective '{objective}'",
            "use --objective size (bits per weight), decode (tokens/s) or memory (peak bytes)",
        )
    if max_candidates < max(1, len(formats)):
        raise UserInputError(
            f"--max-candidates must be at least 1 per format searched ({len(formats)})",
            f"e.g. --max-candidates {3 * max(1, len(formats))}",
        )


def load_profile(path: Path) -> Profile:
    from pydantic import ValidationError

    from quantkit.search.profile import Profile

    try:
        return Profile.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValidationError, ValueError) as err:
        first = str(err).splitlines()[0]
        raise UserInputError(
            f"'{path}' is not a sensitivity profile: {first}",
            "pass the sensitivity.json that `quantkit sensitivity --out DIR` wrote",
        ) from None


def run_search(request: SearchRequest, reporter: Reporter, view: SweepView | None = None) -> SearchResult:
    """Profiles, paths, candidates as one sweep, winner and its recipe, in ``request.out``."""
    from quantkit.search import mix
    from quantkit.util.library_log import LIBRARY_LOG, LOG_NAME
    from quantkit.util.progress import library_bars_hidden, quiet_libraries

    start = time.perf_counter()
    _check_out(request.out)
    quiet_libraries(request.verbose)
    mark = LIBRARY_LOG.begin_run()
    given = _given_profiles(request)
    request.out.mkdir(parents=True, exist_ok=True)
    profiles: dict[str, tuple[Profile, str]] = {}
    for fmt in request.formats:
        with library_bars_hidden(request.verbose):
            profiles[fmt] = given.get(fmt) or (_proxy_profile(request, fmt, reporter), "proxy")
        name = "sensitivity.json" if len(request.formats) == 1 else f"sensitivity-{fmt}.json"
        (request.out / name).write_text(profiles[fmt][0].model_dump_json(indent=1), encoding="utf-8")
    profile_s = time.perf_counter() - start
    paths = {fmt: mix.build_path(p, mix.calibrated(p), request.seed) for fmt, (p, _) in profiles.items()}
    record = SearchRecord(
        model=next(iter(profiles.values()))[0].model,
        budget=request.budget,
        objective=request.objective,
        seed=request.seed,
        max_candidates=request.max_candidates,
        formats=list(request.formats),
        paths=[
            FormatPath(
                format=p.format,
                profile=source,
                steps=len(paths[fmt].steps),
                bpw=[round(paths[fmt].bpw(0), 4), round(paths[fmt].bpw(len(paths[fmt].steps)), 4)],
                group_size=p.group_size,
            )
            for fmt, (p, source) in profiles.items()
        ],
    )
    search_start = time.perf_counter()
    for position, fmt in enumerate(request.formats):
        left = len(request.formats) - position  # the candidates left, split evenly, the first formats first
        share = -(-(request.max_candidates - len(record.candidates)) // left)
        _search(request, profiles[fmt][0], paths[fmt], record, view, len(record.candidates) + share)
    record.seconds = {
        "profile": round(profile_s, 3),
        "candidates": round(time.perf_counter() - search_start, 3),
        "total": round(time.perf_counter() - start, 3),
    }
    code = _choose(request, record)
    _add_profile_to_report(request.out, [p for p, _ in profiles.values()])
    (request.out / "search.json").write_text(record.model_dump_json(indent=1), encoding="utf-8")
    (request.out / LOG_NAME).write_text(LIBRARY_LOG.run_text(mark), encoding="utf-8")
    return SearchResult(request.out, record, code)


def _proxy_profile(request: SearchRequest, fmt: SearchFormat, reporter: Reporter) -> Profile:
    from quantkit.search.profile import ProfileRequest, build_profile

    base, low = DEFAULT_TYPES[fmt]
    profile_request = ProfileRequest(request.recipe, base, low, False, request.trust_remote_code, format=fmt)
    return build_profile(profile_request, reporter)


def _given_profiles(request: SearchRequest) -> dict[str, tuple[Profile, str]]:
    """The ``--profile`` files by format: one per format searched at most, none of another."""
    given: dict[str, tuple[Profile, str]] = {}
    for path in request.profiles:
        profile = load_profile(path)
        if profile.format not in request.formats or profile.format in given:
            twice = profile.format in given
            raise UserInputError(
                f"'{path}' is a {profile.format} profile"
                + (", and another was given" if twice else f", not of --formats {','.join(request.formats)}"),
                "give at most one --profile per format searched",
            )
        given[profile.format] = (profile, str(path))
    return given


def _add_profile_to_report(folder: Path, profiles: list[Profile]) -> None:
    """The sweep's HTML report with the sensitivity charts after its quality-vs-size plot."""
    from quantkit.report.sensitivity import profile_section
    from quantkit.util.fileio import write_text_atomic

    report = folder / "sweep" / "report.html"
    if report.is_file():
        html = report.read_text(encoding="utf-8")
        sections = "\n".join(map(profile_section, profiles))
        write_text_atomic(folder / "report.html", html.replace("</body>", sections + "\n</body>", 1))


def _check_out(out: Path) -> None:
    known: tuple[str, ...] = ("search.json", "sensitivity.json", "sweep", "candidates", "report.html")
    known += ("chosen-recipe.yaml",)
    known += tuple(f"sensitivity-{fmt}.json" for fmt in FORMATS)
    if out.exists() and any(path.name not in known for path in out.iterdir()):
        raise UserInputError(
            f"'{out}' exists and is not a search folder",
            "pass a new --out (or the folder of the same search)",
        )


def _search(
    request: SearchRequest,
    profile: Profile,
    path: DemotionPath,
    record: SearchRecord,
    view: SweepView | None,
    limit: int,
) -> None:
    """Evaluate candidates on ``path`` until its frontier is bracketed or ``record`` holds
    ``limit`` candidates."""
    last = len(path.steps)
    passed, failed = 0, last + 1  # indices known to meet / not to meet the budget (assumed at the ends)
    scale: float | None = None  # measured value per predicted unit, from the evaluated candidates
    while len(record.candidates) < limit:
        index = _next_index(path, request.budget.limit, (passed, failed), scale)
        if index is None:
            record.frontier_found = True
            break
        candidate = _evaluate(request, profile, path, index, record, view)
        if candidate.value is None:
            failed = min(failed, index)  # a run that could not be scored does not meet the budget
            continue
        if candidate.passed:
            passed = max(passed, index)
        else:
            failed = min(failed, index)
        if candidate.predicted_kld_increase > 0 and candidate.value > 0:
            scale = candidate.value / candidate.predicted_kld_increase
        if failed - passed <= 1 or (
            failed <= last and path.bpw(passed) - path.bpw(failed) < request.tolerance_bpw
        ):
            record.frontier_found = record.frontier_found or passed > 0 or failed <= last
            break


def _next_index(
    path: DemotionPath, limit: float, bracket: tuple[int, int], scale: float | None
) -> int | None:
    """The furthest index predicted to meet ``limit`` inside the open bracket (secant on the
    measured scale, else halfway in bits), or its middle when the prediction falls outside."""
    passed, failed = bracket
    if failed - passed <= 1:
        return None
    last = min(failed - 1, len(path.steps))
    if scale is None:  # nothing measured yet: halfway between the ends in bits per weight
        middle_bpw = (path.bpw(passed) + path.bpw(last)) / 2
        guess = next((i for i in range(passed + 1, last + 1) if path.bpw(i) <= middle_bpw), last)
    else:
        fits = [i for i in range(passed + 1, last + 1) if path.predicted(i) * scale <= limit]
        guess = fits[-1] if fits else passed + 1
        if guess in (passed + 1, last) and last - passed > 2:  # pinned to an edge: bisect instead
            guess = (passed + last + 1) // 2 if not fits else guess
    return max(passed + 1, min(guess, last))


def _evaluate(
    request: SearchRequest,
    profile: Profile,
    path: DemotionPath,
    index: int,
    record: SearchRecord,
    view: SweepView | None,
) -> Candidate:
    """Write the candidate's recipe and run every candidate so far as one sweep (finished ones kept)."""
    from quantkit.search.mix import recipe_options

    name = f"search-{len(record.candidates) + 1:02d}-{profile.format}-step{index}"
    recipe_path = request.out / "candidates" / f"{name}.yaml"
    recipe_path.parent.mkdir(parents=True, exist_ok=True)
    method, options = recipe_options(profile, path.mix(index))
    description = (
        f"searched {profile.format.upper()} mix: step {index} of {len(path.steps)} on the demotion "
        f"path, predicted {path.bpw(index):.3f} bits per parameter"
    )
    recipe = _candidate_recipe(request, name, description, method, options)
    recipe_path.write_text(recipe.to_yaml(), encoding="utf-8")
    candidate = Candidate(
        name=name,
        format=profile.format,
        index=index,
        predicted_bpw=round(path.bpw(index), 4),
        predicted_kld_increase=path.predicted(index),
        run_id=name,
        recipe=str(recipe_path),
    )
    record.candidates.append(candidate)
    result = _sweep(request, [Path(c.recipe) for c in record.candidates], view)
    run = next((r for r in result.manifest.runs if r.name == name or r.run_id == name), None)
    if run is None or run.state != "done":
        candidate.error = "the run failed" if run is None else (run.error or run.state)
        return candidate
    candidate.run_id = run.run_id
    manifest = json.loads((result.folder / "runs" / run.run_id / "manifest.json").read_text(encoding="utf-8"))
    metrics = manifest["metrics"]["quantized"]
    candidate.kld = metrics["kld_mean"]["value"]
    candidate.value = metrics[request.budget.metric]["value"]
    artifact = manifest["artifact"]  # the whole file's bits per parameter (GGUF: the file's own count)
    candidate.bpw = artifact.get("file_bpw") or artifact["details"].get("bits_per_weight")
    if request.objective != "size":  # the sweep benched every run in llama.cpp
        candidate.decode_tok_s = _metric(metrics, "decode_tok_s")
        candidate.peak_memory_bytes = _metric(metrics, "peak_memory_bytes")
    candidate.passed = candidate.value is not None and candidate.value <= request.budget.limit
    return candidate


def _candidate_recipe(
    request: SearchRequest, name: str, description: str, method: str, options: dict[str, JsonValue]
) -> Recipe:
    from quantkit.inputs.recipe import validate_recipe

    base = request.recipe.model_dump(
        mode="json", exclude={"name", "description", "method", "options", "gates"}
    )
    gates: dict[str, JsonValue] = {metric_info(request.budget.metric).gate_field: request.budget.limit}
    data = base | {
        "name": name,
        "description": description,
        "method": method,
        "options": options,
        "gates": gates,
    }
    return validate_recipe(data)


def _sweep(request: SearchRequest, recipes: list[Path], view: SweepView | None) -> SweepResult:
    from quantkit.sweep.driver import SweepRequest, run_sweep
    from quantkit.sweep.spec import RecipeEntry, SweepSpec

    spec = SweepSpec(
        name="search",
        models=[request.recipe.model],
        recipes=[RecipeEntry(recipe=str(path)) for path in recipes],
    )
    sweep_request = SweepRequest(
        spec=spec,
        out=request.out / "sweep",
        bench=request.objective != "size",  # decode speed and memory are measured, not predicted
        trust_remote_code=request.trust_remote_code,
        verbose=request.verbose,
    )
    return run_sweep(sweep_request, view)


def _metric(metrics: dict[str, dict[str, float | None]], name: str) -> float | None:
    entry = metrics.get(name)
    return None if entry is None else entry.get("value")


def _rank(candidate: Candidate, objective: Objective) -> tuple[float, float]:
    """Sort key of a candidate that met the budget: its objective, then its bits per weight."""
    bpw = candidate.bpw or 0.0
    if objective == "decode":
        return (-(candidate.decode_tok_s or 0.0), bpw)
    if objective == "memory":
        return (candidate.peak_memory_bytes or 0.0, bpw)
    return (bpw, candidate.value or 0.0)


def _objective_value(candidate: Candidate, objective: Objective) -> str:
    if objective == "decode":
        return f"{candidate.decode_tok_s:.1f} tokens/s decode, {candidate.bpw} bpw"
    if objective == "memory":
        return f"{(candidate.peak_memory_bytes or 0) / 1e6:.1f} MB peak, {candidate.bpw} bpw"
    return f"{candidate.bpw} bpw"


def _choose(request: SearchRequest, record: SearchRecord) -> int:
    """The candidate that met the budget with the best objective (exit 0): the fewest bits per
    weight, the fastest decode or the least peak memory (those two measured by the sweep's
    bench); or none (exit 1): the closest one is named in ``why``."""
    objective = request.objective
    met = [c for c in record.candidates if c.passed and c.bpw is not None]
    if objective == "decode":
        met = [c for c in met if c.decode_tok_s]
    elif objective == "memory":
        met = [c for c in met if c.peak_memory_bytes]
    if not met:
        scored = [c for c in record.candidates if c.value is not None]
        closest = min(scored, key=lambda c: c.value or 0.0, default=None)
        record.why = f"no candidate met {request.budget.describe()}" + (
            f"; the closest was {closest.name} at {closest.value:.4g} ({closest.bpw} bpw)" if closest else ""
        )
        return 1
    best = min(met, key=lambda c: _rank(c, objective))
    record.chosen = best.name
    others = [c for c in record.candidates if c is not best]
    record.why = (
        f"{best.name} met {request.budget.describe()} (measured {best.value:.4g}) at "
        f"{_objective_value(best, objective)}: {OBJECTIVE_TERMS[objective]} of the {len(met)} "
        "candidate(s) that met it" + (f"; {len(others)} other(s) evaluated" if others else "")
    )
    chosen = request.out / "chosen-recipe.yaml"
    shutil.copyfile(best.recipe, chosen)
    return 0


def budget_from(max_kld: float | None, max_ppl_increase: float | None) -> Budget:
    """Exactly one budget, non-negative."""
    if (max_kld is None) == (max_ppl_increase is None):
        raise UserInputError(
            "give exactly one quality budget", "--max-kld 0.05 (nats) or --max-ppl-increase 3%"
        )
    if max_kld is not None:
        if max_kld <= 0:
            raise RecipeError(f"--max-kld {max_kld:g} is not a positive KLD", "e.g. --max-kld 0.05")
        return Budget(metric="kld_mean", limit=max_kld)
    assert max_ppl_increase is not None
    if max_ppl_increase <= 0:
        raise RecipeError(
            f"--max-ppl-increase {max_ppl_increase:g}% is not positive", "e.g. --max-ppl-increase 3%"
        )
    return Budget(metric="ppl_increase_pct", limit=max_ppl_increase)
