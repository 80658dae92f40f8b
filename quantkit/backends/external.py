"""An artifact quantkit did not make (a hub GGUF, another tool's quant, another run): imported
as it is, then evaluated, benchmarked and gated like a quantized run (run kind ``external``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field, JsonValue

from quantkit.backends.base import Artifact, Backend, BackendOptions, QuantizeJob
from quantkit.inputs.specs import RunKind

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from quantkit.inputs.external import ExternalArtifact


class ExternalOptions(BackendOptions):
    """The artifact to evaluate."""

    artifact: str = Field(description="a GGUF file, an HF model folder or a quantkit run folder")


class ExternalBackend(Backend[ExternalOptions]):
    """No quantization: the given artifact is imported into the run and scored as it is."""

    name = "external"
    summary = "evaluate an existing artifact (GGUF file, HF folder, quantkit run) against a baseline"
    options_model = ExternalOptions
    runtime = "hf"  # or llamacpp: the artifact decides
    library = ""
    run_kind: ClassVar[RunKind] = "external"

    @cached_property
    def source(self) -> ExternalArtifact:
        from quantkit.inputs.external import inspect_external

        return inspect_external(Path(self.options.artifact))

    def requires_calibration(self) -> bool:
        return False

    def describe(self) -> tuple[str, float]:
        artifact = self.source
        return artifact.scheme, artifact.weight_bits or 0.0

    def inputs(self) -> list[Path]:
        return list(self.source.files)

    def check_vocabulary(self, tokenizer: PreTrainedTokenizerBase, token_ids: Sequence[int]) -> None:
        from quantkit.inputs.external import check_vocabulary

        check_vocabulary(self.source, tokenizer, token_ids)

    def input_fingerprint(self) -> dict[str, JsonValue]:
        """Size and modification time of each file: a resumed run must import the same ones."""
        return {str(p.resolve()): f"{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in self.source.files}

    def runtime_baseline(self, model_path: Path, log: Callable[[str], None]) -> Path | None:
        from quantkit.errors import UserInputError

        try:
            runtime = self.source.runtime
        except UserInputError:  # the original is gone (a bench of the run later): its name says
            runtime = "llamacpp" if self.options.artifact.endswith(".gguf") else "hf"
        if runtime != "llamacpp":
            return None
        from quantkit.backends.gguf import GGUFBackend, GGUFOptions

        return GGUFBackend(GGUFOptions()).runtime_baseline(model_path, log)

    def quantize(self, job: QuantizeJob) -> Artifact:
        from quantkit.inputs.external import import_external, provenance

        source = self.source
        start = time.perf_counter()
        job.log(f"importing {source.kind} artifact {source.path}")
        how = import_external(source, job.out_dir)
        details: dict[str, JsonValue] = {
            "provenance": provenance(source),
            "import": how,
            "import_s": round(time.perf_counter() - start, 3),
        }
        if source.format == "gguf":
            from quantkit.backends.gguf import inspect_gguf

            details |= inspect_gguf(source.path).details()
        weight_bits = source.weight_bits
        if weight_bits is None:  # no nominal figure in its metadata: the file's own
            weight_bits = _file_bits(details, job.out_dir, job.model_path)
        return Artifact(job.out_dir, source.format, source.runtime, source.scheme, weight_bits, details)


def _file_bits(details: dict[str, JsonValue], folder: Path, model_path: Path) -> float:
    """Bits per parameter of the imported files (GGUF: its own count; safetensors: tensor
    bytes over the baseline's parameters)."""
    bpw = details.get("bits_per_weight")
    if isinstance(bpw, (int, float)):
        return float(bpw)
    from quantkit.inputs.plan import count_parameters, tensor_bytes

    parameters = count_parameters(model_path)
    return round(8 * tensor_bytes(folder) / parameters, 3) if parameters else 0.0
