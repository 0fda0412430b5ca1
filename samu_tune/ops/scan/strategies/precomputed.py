"""Strategy ``precomputed_decay``: the serial walk reading a precomputed radial decay.

A parallel pass (:func:`samu_tune.kernels.decay.radial_decay`) evaluates
rho[b, t, m] = exp(-nu[m] e^eta[b, t]) for every (token, mode) into a [B, L, M] fp32 buffer,
taking the per-element exponential off the walk's serial critical path; the walk
(``serial_scan`` with PRECOMPUTED=True) reads rho instead.  The backward walk reuses the same
buffer, held from the forward pass.  Config space and determinism are those of ``serial``.
"""
from __future__ import annotations

import sys

from samu_tune.kernels import complex_math, decay, serial as serial_kernels, tile
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.capability import Capability
from samu_tune.registry import Strategy, register
from samu_tune.ops.scan.tensors import ScanInputs, ScanOutput
from samu_tune.ops.scan.strategies import serial
from samu_tune.ops.scan.strategies.serial import SerialConfig, SerialPlan


def run(inputs: ScanInputs, cfg: SerialConfig) -> ScanOutput:
    return serial.serial_scan(inputs, SerialPlan.of(cfg, precomputed=True))


def workspace_bytes(problem: ScanProblem, cfg: SerialConfig) -> int:
    """The serial walk's partials plus the decay buffer [B, L, M] fp32 (held from forward to
    backward when training)."""
    return serial.workspace_bytes(problem, cfg) + 4 * problem.B * problem.L * problem.M


STRATEGY = register(Strategy(
    name="precomputed_decay",
    description="parallel pass computes exp(-nu e^eta) as [B,L,M] fp32; the serial walk reuses it",
    capability=Capability(),
    run=run,
    config_model=SerialConfig,
    valid=serial.valid,
    default=serial.default,
    workspace_bytes=workspace_bytes,
    priority=0,
    modules=(sys.modules[__name__], serial, serial_kernels, decay, complex_math, tile),
    autograd=lambda cfg: (serial._SerialScan, SerialPlan.of(cfg, precomputed=True)),
))
