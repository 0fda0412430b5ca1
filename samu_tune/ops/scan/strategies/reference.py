"""The torch reference as a strategy: any device, any dtype including float64, slow."""
from __future__ import annotations

import sys

from samu_tune.ops.scan import reference
from samu_tune.ops.scan.capability import ALL_DTYPES, CONTROL_DTYPES, Capability
from samu_tune.registry import Strategy, register
from samu_tune.ops.scan.tensors import ScanInputs, ScanOutput


def run(inputs: ScanInputs, cfg) -> ScanOutput:
    out = reference.scan_reference(
        inputs.eta, inputs.delta, inputs.nu_log, inputs.theta_log, inputs.br, inputs.bi,
        initial_state=inputs.initial_state, segment_pos=inputs.segment_pos,
        output_final_state=inputs.output_final_state)
    return out


STRATEGY = register(Strategy(
    name="reference",
    description="pure torch step loop; any device, float64-capable; ground truth and fallback",
    capability=Capability(
        dtypes=ALL_DTYPES | {"float64"}, control_dtypes=CONTROL_DTYPES | {"float64"},
        devices=frozenset({"cpu", "cuda"}), triton=False),
    run=run,
    workspace_bytes=lambda p, cfg: 2 * 4 * p.B * p.L * p.M * (3 if p.backward else 1),
    priority=-100,
    modules=(sys.modules[__name__], reference),
))
