"""GPTQ through GPTQModel (``method: gptq`` with ``options.engine: gptqmodel``): the GPTQ
checkpoint format, which transformers loads with optimum and GPTQModel installed."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, JsonValue, model_validator

from quantkit.backends.base import Artifact, QuantizeJob
from quantkit.backends.int_weights import IntSchemeOptions, IntWeightBackend


class GPTQModelOptions(IntSchemeOptions):
    """GPTQ by GPTQModel, with its QuantizeConfig's own option names. Every linear layer of
    the decoder blocks is quantized; the embeddings and the output head stay unquantized."""

    bits: Literal[2, 3, 4, 8] = Field(4, description="weight bits (the GPTQ format: 2, 3, 4 or 8)")
    damp_percent: float = Field(
        0.05, gt=0, lt=1, description="Hessian dampening, fraction of the mean diagonal (GPTQModel: 0.05)"
    )
    damp_auto_increment: float = Field(
        0.01, ge=0, description="added to damp_percent while a layer's Hessian fails to invert"
    )
    desc_act: bool = Field(False, description="quantize columns by decreasing activation (reorders groups)")
    act_group_aware: bool = Field(
        True, description="activation order within groups, group order kept (needs desc_act: false)"
    )
    static_groups: bool = Field(False, description="fix each group's scale before the GPTQ updates")
    true_sequential: bool = Field(True, description="quantize a layer's modules one subset after another")
    mse: float = Field(0.0, ge=0, description="scale search by MSE (a norm such as 2.4; 0 = min-max)")
    engine: Literal["gptqmodel"] = Field("gptqmodel", description="implementation")

    @model_validator(mode="after")
    def _one_activation_order(self) -> GPTQModelOptions:
        if self.desc_act and self.act_group_aware:
            raise ValueError("desc_act: true needs act_group_aware: false (GPTQModel allows one of them)")
        return self

    def quantize_config(self) -> dict[str, JsonValue]:
        """GPTQModel's ``QuantizeConfig`` keyword arguments."""
        return {
            "bits": self.bits,
            "group_size": self.group_size or -1,
            "sym": self.symmetric,
            "desc_act": self.desc_act,
            "act_group_aware": self.act_group_aware,
            "damp_percent": self.damp_percent,
            "damp_auto_increment": self.damp_auto_increment,
            "static_groups": self.static_groups,
            "true_sequential": self.true_sequential,
            "mse": self.mse,
        }


class GPTQModelBackend(IntWeightBackend[GPTQModelOptions]):
    """GPTQ W{2,3,4,8}A16 via GPTQModel (layer by layer, on quantkit's calibration ids)."""

    name = "gptq"
    summary = "GPTQ integer weights via GPTQModel (GPTQ checkpoint format)"
    options_model = GPTQModelOptions
    library = "gptqmodel"

    def requires_calibration(self) -> bool:
        return True

    def check_dependencies(self) -> None:
        from quantkit.backends.gptqmodel_run import gptqmodel_version

        gptqmodel_version()

    def quantize(self, job: QuantizeJob) -> Artifact:
        from quantkit.backends.gptqmodel_run import run_gptqmodel

        details = run_gptqmodel(job, self.options.quantize_config())
        scheme, bits = self.describe()
        return Artifact(job.out_dir, "gptq", self.runtime, scheme, bits, details)
