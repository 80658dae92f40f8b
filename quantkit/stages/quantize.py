"""Quantization: the backend makes the artifact from the source model (and calibration)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from quantkit.stages.base import PlanInputs, Stage, StageOutput
from quantkit.stages.results import QuantizeResult, StageResult
from quantkit.util.faults import failpoint

if TYPE_CHECKING:
    from quantkit.backends.base import Artifact
    from quantkit.stages.context import RunContext


def decoder_layers(model_path: Path) -> int | None:
    """``num_hidden_layers`` from config.json (for per-layer progress)."""
    import json

    data = json.loads((model_path / "config.json").read_text(encoding="utf-8"))
    config = data.get("text_config", data) if isinstance(data, dict) else {}
    layers = config.get("num_hidden_layers")
    return layers if isinstance(layers, int) and layers > 0 else None


def file_bits_per_parameter(artifact: Artifact, parameters: int | None) -> float | None:
    """Bits per parameter of the whole artifact file(s): for GGUF the file's own count, for
    safetensors the tensor bytes over the source model's parameters (packed ints, scales and
    the unquantized embeddings included)."""
    bpw = artifact.details.get("bits_per_weight")
    if artifact.format == "gguf" and isinstance(bpw, (int, float)):
        return float(bpw)
    if not parameters:
        return None
    from quantkit.inputs.plan import tensor_bytes

    return round(8 * tensor_bytes(artifact.path) / parameters, 3)


class QuantizeStage(Stage[QuantizeResult]):
    """The artifact: verified from an earlier attempt, or made from scratch by the backend."""

    kind = "quantize"

    result_type = QuantizeResult

    @classmethod
    def planned(cls, inputs: PlanInputs) -> list[Stage[StageResult]]:
        return [cls()]

    def exact_folder(self, ctx: RunContext) -> Path | None:
        return ctx.run.artifact_dir

    def reused(self, ctx: RunContext, result: StageResult) -> None:
        files = ctx.journal.stages.get(self.name, {}).get("files")
        count = len(files) if isinstance(files, dict) else 0
        ctx.reporter.log(f"quantization: resumed ({count} files verified)")

    def run(self, ctx: RunContext) -> StageOutput[QuantizeResult]:
        from quantkit.backends.base import QuantizeJob
        from quantkit.util.fileio import files_under

        out_dir = ctx.run.artifact_dir
        shutil.rmtree(out_dir, ignore_errors=True)  # never build on a half-written one
        start = time.perf_counter()
        total = decoder_layers(ctx.source.path)
        external = ctx.backend.run_kind == "external"
        label = "importing the artifact" if external else f"quantizing with {ctx.recipe.method}"
        with ctx.reporter.stage(label, total=total) as advance:
            progress = [0]

            def on_layer(index: int) -> None:  # layer `index` started: the ones before it are done
                failpoint("quantize.layer", index)
                if total and index > progress[0]:
                    advance(min(index, total) - progress[0])
                    progress[0] = min(index, total)

            job = QuantizeJob(
                model_path=ctx.source.path,
                out_dir=out_dir,
                device=ctx.device,
                seed=ctx.recipe.seed,
                calibration=ctx.tokens.calibration_windows(),
                trust_remote_code=ctx.settings.trust_remote_code,
                verbose=ctx.settings.verbose,
                log=ctx.reporter.log,
                on_layer=on_layer,
            )
            artifact = ctx.backend.quantize(job)
            if total:
                advance(total - progress[0])
            recipe_file = artifact.path / "quantkit-recipe.yaml"
            recipe_file.unlink(missing_ok=True)  # never write through a hard link to an imported file
            recipe_file.write_text(ctx.recipe.to_yaml(), encoding="utf-8")
        seconds = time.perf_counter() - start
        source_gguf = artifact.details.get("source_gguf")
        conversion = source_gguf.get("conversion_s") if isinstance(source_gguf, dict) else None
        if isinstance(conversion, (int, float)):  # the one-off F16 conversion is not quantization
            seconds -= float(conversion)
        from quantkit.results.manifest import ArtifactInfo
        from quantkit.util.fileio import folder_bytes

        info = ArtifactInfo(
            format=artifact.format,
            runtime=artifact.runtime,
            scheme=artifact.scheme,
            weight_bits=artifact.weight_bits,
            disk_bytes=folder_bytes(artifact.path),
            file_bpw=file_bits_per_parameter(artifact, ctx.source.parameters()),
            details=artifact.details,
        )
        return StageOutput(
            QuantizeResult(artifact=info, seconds=round(seconds, 3)), files_under(artifact.path)
        )
