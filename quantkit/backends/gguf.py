"""GGUF for llama.cpp: convert with llama.cpp's converter, quantize with its quantize API."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, JsonValue, ValidationInfo, field_validator

from quantkit.backends.base import Artifact, Backend, BackendOptions, QuantizeJob
from quantkit.errors import BackendError, RecipeError
from quantkit.inputs.tokenizer_check import TOKENIZER_CHECK_VERSION, check_converted_tokenizer
from quantkit.llamacpp.gguf_scheme import gguf_scheme
from quantkit.util.faults import failpoint
from quantkit.util.progress import native_stderr_captured

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from llama_cpp import llama_model_quantize_params

    from quantkit.llamacpp.gguf_types import GGUFTensor, Overrides

GGUFType = Literal[
    "F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_0",
    "IQ4_XS", "IQ4_NL", "Q3_K_L", "Q3_K_M", "Q3_K_S", "IQ3_M", "IQ3_S", "IQ3_XS", "IQ3_XXS",
    "Q2_K", "Q2_K_S", "IQ2_M", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_M", "IQ1_S",
]  # fmt: skip
# ggml's per-tensor types (llama-quantize's --tensor-type names; quantkit.llamacpp.gguf_types.TENSOR_TYPES)
TensorType = Literal[
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
    "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_NL", "IQ4_XS",
]  # fmt: skip
# llama-quantize refuses these without an importance matrix
NEEDS_IMATRIX = {"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M", "Q2_K_S"}
# nominal bits per weight of each type (llama.cpp's own table); the real mix is measured
NOMINAL_BITS = {
    "F32": 32.0, "F16": 16.0, "BF16": 16.0, "Q8_0": 8.5, "Q6_K": 6.56, "Q5_K_M": 5.69, "Q5_K_S": 5.54,
    "Q5_0": 5.5, "Q4_K_M": 4.89, "Q4_K_S": 4.58, "Q4_0": 4.5, "IQ4_XS": 4.25, "IQ4_NL": 4.5,
    "Q3_K_L": 4.27, "Q3_K_M": 3.91, "Q3_K_S": 3.5, "IQ3_M": 3.66, "IQ3_S": 3.44, "IQ3_XS": 3.3,
    "IQ3_XXS": 3.06, "Q2_K": 2.96, "Q2_K_S": 2.96, "IQ2_M": 2.7, "IQ2_S": 2.5, "IQ2_XS": 2.31,
    "IQ2_XXS": 2.06, "IQ1_M": 1.75, "IQ1_S": 1.56,
}  # fmt: skip


class GGUFOptions(BackendOptions):
    """llama.cpp quantization type, optional importance matrix from the calibration set."""

    type: GGUFType = Field("Q4_K_M", description="llama.cpp quantization type (llama-quantize's names)")
    imatrix: bool = Field(False, description="importance matrix from the shared calibration set")
    outtype: Literal["f16", "bf16", "f32"] = Field("f16", description="precision of the converted GGUF")
    threads: int | None = Field(None, ge=1, description="quantization threads (default: all cores)")
    tensor_types: dict[str, TensorType] = Field(
        default_factory=dict,
        description="ordered tensor-name regex -> ggml type (llama-quantize's --tensor-type; first match "
        "wins); a mapping or a list of PATTERN=TYPE",
    )
    output_tensor_type: TensorType | None = Field(
        None, description="ggml type of output.weight (llama-quantize's --output-tensor-type)"
    )
    token_embedding_type: TensorType | None = Field(
        None, description="ggml type of token_embd.weight (llama-quantize's --token-embedding-type)"
    )

    @field_validator("tensor_types", mode="before")
    @classmethod
    def _tensor_types(cls, value: object) -> object:
        from quantkit.llamacpp.gguf_overrides import tensor_types

        return tensor_types(value)

    @field_validator("output_tensor_type", "token_embedding_type", mode="before")
    @classmethod
    def _tensor_type(cls, value: object, info: ValidationInfo) -> object:
        from quantkit.llamacpp.gguf_overrides import tensor_type

        return tensor_type(value, f"options.{info.field_name}")

    def overrides(self) -> Overrides:
        """The per-tensor types in llama.cpp's terms."""
        from quantkit.llamacpp.gguf_types import Overrides

        return Overrides(tuple(self.tensor_types.items()), self.output_tensor_type, self.token_embedding_type)


@dataclass(frozen=True)
class GGUFInfo:
    """What a GGUF file holds: architecture, tensor types, parameters and real bits per weight."""

    architecture: str | None
    tensor_types: dict[str, int]
    parameters: int
    bits_per_weight: float
    file_bytes: int
    input_widths: dict[str, int]

    def details(self) -> dict[str, JsonValue]:
        types: dict[str, JsonValue] = dict(self.tensor_types)
        return {
            "architecture": self.architecture,
            "tensor_types": types,
            "parameters": self.parameters,
            "bits_per_weight": self.bits_per_weight,
            "file_bytes": self.file_bytes,
        }


class GGUFBackend(Backend[GGUFOptions]):
    """HF -> GGUF (llama.cpp converter) -> llama.cpp k-quants / i-quants, run by llama.cpp."""

    name = "gguf"
    summary = "GGUF for llama.cpp: k-quants and i-quants, optional imatrix (llama-cpp-python)"
    options_model = GGUFOptions
    runtime = "llamacpp"
    library = "llama-cpp-python"

    def requires_calibration(self) -> bool:
        return self.options.imatrix

    def check_options(self) -> None:
        if self.options.type in NEEDS_IMATRIX and not self.options.imatrix:
            raise RecipeError(
                f"GGUF type {self.options.type} needs an importance matrix",
                "set options.imatrix=true (computed from the calibration set)",
            )
        if self.options.overrides() and self.options.type in ("F16", "BF16", "F32"):
            raise RecipeError(
                "per-tensor types need a quantized options.type "
                f"(llama.cpp ignores them for {self.options.type})",
                "set options.type to the type of the other tensors, e.g. Q8_0 or Q4_K_M",
            )

    def check_weights(self, model_path: Path) -> None:
        """Per-tensor types must name tensors of this model and fit their rows (predicted names)."""
        overrides = self.options.overrides()
        if overrides:
            from quantkit.inputs.plan import gguf_tensors
            from quantkit.llamacpp.gguf_overrides import check_overrides

            tensors = gguf_tensors(model_path)[0]
            if tensors:  # no safetensors headers: checked on the converted GGUF before quantizing
                check_overrides(tensors, overrides, self.options.imatrix)

    def check_model(self, config: Mapping[str, JsonValue]) -> None:
        """llama-cpp-python present and the architecture convertible, before anything is written."""
        from quantkit.llamacpp.convert import check_architecture, ensure_converter

        architectures = config.get("architectures")
        first = architectures[0] if isinstance(architectures, list) and architectures else None
        check_architecture(str(first or config.get("model_type")), ensure_converter())

    def describe(self) -> tuple[str, float]:
        suffix = "+imatrix" if self.options.imatrix else ""
        suffix += "+overrides" if self.options.overrides() else ""
        return f"{self.options.type}{suffix}", NOMINAL_BITS[self.options.type]

    def _converted(self, model_path: Path, log: Callable[[str], None]) -> tuple[Path, float | None]:
        """The unquantized GGUF of ``model_path``, cached per (model, precision, converter
        version); with the seconds the conversion took (None when it came from the cache)."""
        from quantkit.inputs.models import fingerprint
        from quantkit.llamacpp.convert import bindings_version, convert, ensure_converter
        from quantkit.paths import cache_dir
        from quantkit.util.fileio import cache_entry_lock

        outtype = self.options.outtype
        converter = ensure_converter(log)
        checked = f"checked-{TOKENIZER_CHECK_VERSION}"
        identity = f"{fingerprint(model_path)}|{outtype}|{bindings_version()}|{checked}"
        key = hashlib.sha256(identity.encode()).hexdigest()
        base = cache_dir() / "gguf" / f"{key[:24]}-{outtype}.gguf"
        if base.is_file():
            return base, None
        with cache_entry_lock(base):  # another process may be converting it: wait, then reuse
            if base.is_file():
                return base, None
            log(f"converting to a {outtype} GGUF with llama.cpp's converter")
            base.parent.mkdir(parents=True, exist_ok=True)
            partial = base.with_name(f".{base.name}.{os.getpid()}.partial")
            start = time.perf_counter()
            try:
                convert(model_path, partial, outtype, converter)
                check_converted_tokenizer(model_path, partial)
                os.replace(partial, base)
            finally:
                partial.unlink(missing_ok=True)
        return base, round(time.perf_counter() - start, 3)

    def runtime_baseline(self, model_path: Path, log: Callable[[str], None]) -> Path | None:
        return self._converted(model_path, log)[0]

    def quantize(self, job: QuantizeJob) -> Artifact:
        from quantkit.llamacpp.convert import bindings_version
        from quantkit.util.fileio import file_sha256

        options = self.options
        job.out_dir.mkdir(parents=True, exist_ok=True)
        out_file = job.out_dir / "model.gguf"
        base, conversion_s = self._converted(job.model_path, job.log)
        details: dict[str, JsonValue] = {
            "library": "llama-cpp-python",
            "library_version": bindings_version(),
            "source_gguf": {
                "path": str(base),
                "sha256": file_sha256(base),
                "outtype": options.outtype,
                "conversion_s": conversion_s,
            },
        }
        overrides = options.overrides()
        if overrides:  # again on the converter's real names and shapes, before quantizing
            from quantkit.llamacpp.gguf_overrides import check_overrides

            check_overrides(_tensors(base), overrides, options.imatrix)
        if options.type.lower() == options.outtype:
            shutil.copyfile(base, out_file)
        else:
            imatrix = self._imatrix(job, base) if options.imatrix else None
            job.log(f"quantizing to {options.type} with llama.cpp")
            with native_stderr_captured(job.verbose) as native_log:
                try:
                    llama_quantize(base, out_file, options, imatrix)
                except BackendError as err:
                    tail = " | ".join(line for line in native_log[-3:] if line.strip())
                    raise BackendError(f"{err.message}: {tail}" if tail else err.message, err.hint) from None
            if imatrix is not None:
                details["imatrix"] = {
                    "file": "imatrix.gguf",
                    "tensors": len(imatrix),
                    "chunks": job.calibration.ids.shape[0] if job.calibration is not None else 0,
                }
        info = inspect_gguf(out_file)
        details |= info.details()
        if overrides:  # each override, the tensors it took and what llama.cpp wrote for them
            from quantkit.llamacpp.gguf_file import read_gguf
            from quantkit.llamacpp.gguf_overrides import summary

            written = {tensor.name: tensor.type_name for tensor in read_gguf(out_file).tensors}
            details["overrides"] = summary(_tensors(base), overrides, written)
        held = gguf_scheme(out_file)  # a preset's name, or "mixed" when overrides changed types
        details["type_shares_pct"] = dict(held.shares)
        scheme = held.label + ("+imatrix" if options.imatrix else "")
        return Artifact(job.out_dir, "gguf", self.runtime, scheme, info.bits_per_weight, details)

    def _imatrix(self, job: QuantizeJob, base: Path) -> dict[str, npt.NDArray[np.float32]]:
        from quantkit.backends import imatrix

        if job.calibration is None:
            raise BackendError("the importance matrix needs calibration tokens", "report this")
        job.log("computing the importance matrix on the calibration tokens")
        info = inspect_gguf(base)
        if info.architecture is None:
            raise BackendError(f"'{base}' names no architecture", "report this")
        matrix = imatrix.compute(
            job.model_path, job.calibration, info.architecture, info.input_widths, job.device
        )
        imatrix.save(matrix, job.out_dir / "imatrix.gguf", f"quantkit:{job.calibration.hash[:16]}")
        return matrix.means()


def inspect_gguf(path: Path) -> GGUFInfo:
    """Architecture, tensor-type histogram, parameter count and real bits per weight."""
    from quantkit.llamacpp.gguf_file import read_gguf

    header = read_gguf(path)
    architecture = header.value("general.architecture")
    histogram = Counter(tensor.type_name for tensor in header.tensors)
    params = sum(tensor.n_elements for tensor in header.tensors)
    data_bytes = sum(tensor.n_bytes for tensor in header.tensors)
    widths = {tensor.name: tensor.shape[0] for tensor in header.tensors if len(tensor.shape) >= 2}
    return GGUFInfo(
        architecture=None if architecture is None else str(architecture),
        tensor_types=dict(sorted(histogram.items())),
        parameters=params,
        bits_per_weight=round(8 * data_bytes / max(params, 1), 3),
        file_bytes=path.stat().st_size,
        input_widths=widths,
    )


def _tensors(path: Path) -> list[GGUFTensor]:
    """A GGUF file's tensors in llama-quantize's order, as the quantization rules see them."""
    from quantkit.inputs.plan import file_order
    from quantkit.llamacpp.gguf_file import read_gguf
    from quantkit.llamacpp.gguf_types import GGUFTensor

    tensors = [GGUFTensor(tensor.name, tuple(tensor.shape)) for tensor in read_gguf(path).tensors]
    return sorted(tensors, key=file_order)


def _tensor_overrides(params: llama_model_quantize_params, overrides: Overrides, keep: list[object]) -> None:
    """Per-tensor types into llama.cpp's quantize params, as llama-quantize passes them: an array of
    (pattern, ggml type) ending with a NULL pattern; ``keep`` holds it alive for the call."""
    import gguf
    import llama_cpp

    if overrides.output is not None:
        params.output_tensor_type = gguf.GGMLQuantizationType[overrides.output].value
    if overrides.token_embedding is not None:
        params.token_embedding_type = gguf.GGMLQuantizationType[overrides.token_embedding].value
    if not overrides.tensor_types:
        return
    count = len(overrides.tensor_types)
    entries = (llama_cpp.llama_model_tensor_override * (count + 1))()
    for index, (pattern, kind) in enumerate(overrides.tensor_types):
        encoded = pattern.encode()
        keep.append(encoded)
        entries[index].pattern = encoded
        entries[index].type = gguf.GGMLQuantizationType[kind].value
    entries[count].pattern = None  # the terminator llama.cpp stops at
    params.tt_overrides = ctypes.cast(entries, ctypes.POINTER(llama_cpp.llama_model_tensor_override))
    keep.append(entries)


def llama_quantize(
    source: Path, target: Path, options: GGUFOptions, imatrix: dict[str, npt.NDArray[np.float32]] | None
) -> None:
    import llama_cpp
    import numpy as np

    type_name = options.type
    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{type_name}", None)
    if ftype is None:
        raise RecipeError(f"this llama-cpp-python has no GGUF type {type_name}", "pick another options.type")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = options.threads or 0
    keep: list[object] = []
    _tensor_overrides(params, options.overrides(), keep)
    if imatrix:
        entries = (llama_cpp.llama_model_imatrix_data * (len(imatrix) + 1))()
        for index, (name, values) in enumerate(sorted(imatrix.items())):
            array = np.ascontiguousarray(values, dtype=np.float32)
            keep.append(array)
            entries[index].name = name.encode()
            entries[index].data = array.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            entries[index].size = array.size
        entries[len(imatrix)].name = None  # NULL-terminated
        params.imatrix = ctypes.cast(entries, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
        keep.append(entries)
    partial = target.with_name(f".{target.name}.partial")
    try:
        status = llama_cpp.llama_model_quantize(
            str(source).encode(), str(partial).encode(), ctypes.byref(params)
        )
        if status != 0 or not partial.is_file():
            raise BackendError(
                f"llama.cpp could not quantize to {type_name} (status {status})", "rerun with --verbose"
            )
        failpoint("save.gguf")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
