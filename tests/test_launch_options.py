"""Every kernel launch states the compiler options of :mod:`samu_tune.launch_options`.

Each launch is recorded (``tools/compile_check.py``'s ``recording``, under the
interpreter) while every registered scan strategy runs forward and backward,
the look-back's loop walk (control table and scan), the fused SAMU layer (controller kernels
and the fused scan), a decode step and the generic linear scans; a launch that leaves
``enable_fp_fusion`` to Triton's default (a warning on Triton 3.9, off from 3.10) fails.
"""
import torch

import samu_tune
from samu_tune import registry
from samu_tune.device import device_info
from samu_tune.launch_options import LAUNCH_OPTIONS
from samu_tune.ops.scan.strategies import lookback as lb
from samu_tune.ops.scan.strategies.lookback import LookbackConfig, LookbackPlan
from samu_tune.ops.scan.verify import random_inputs

from _helpers import cpu_problem
from tools import compile_check


def _backward(*tensors):
    sum(t.float().sum() for t in tensors).backward()


def test_every_launch_states_the_options():
    seen: dict = {}
    with compile_check.recording(seen):
        _exercise()
    launches = [(launch["name"], {k: launch["options"].get(k) for k in LAUNCH_OPTIONS})
                for launch in seen.values()]
    names = {name for name, _ in launches}
    assert {"lookback_scan", "serial_scan", "chunk_summary", "chunk_replay",
            "linear_serial_scan", "linear_chunk_summary", "linear_chunk_replay",
            "controller_forward", "controller_backward", "samu_decode_step"} <= names, names
    missing = sorted({name for name, opts in launches if opts != LAUNCH_OPTIONS})
    assert not missing, f"launches without {LAUNCH_OPTIONS}: {missing}"


def _exercise():
    """Every scan strategy forward and backward, the look-back loop walk, the fused layer, a
    decode step and the generic scans, on tiny problems."""
    problem = cpu_problem(2, 40, 20, dtype="bfloat16", resets=True, initial_state=True,
                          final_state=True)
    cpu = device_info("cpu")
    for strat in registry.all_strategies():
        if strat.name == "reference" or strat.reasons(problem, cpu):
            continue           # a Gluon kernel: CUDA only (tools/compile_check.py compiles it)
        inputs = random_inputs(problem, seed=1)
        leaves = [t.detach().clone().requires_grad_(True) for t in inputs.differentiable()]
        eta, delta, nu_log, theta_log, br, bi, h0r, h0i = leaves
        out = samu_tune.scan(eta, delta, nu_log, theta_log, br, bi, initial_state=(h0r, h0i),
                             segment_pos=inputs.segment_pos, output_final_state=True,
                             strategy=(strat.name, strat.default_config(problem)))
        _backward(out.real, out.imag, out.final_state[0])
    # the look-back's loop walk (its control table is a launch of its own)
    loop = LookbackPlan.of(LookbackConfig(chunk=16, block_m=16, num_warps=2, inner="loop"))
    inputs = random_inputs(problem, seed=2)
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs.differentiable()]
    out = lb.lookback_scan(inputs.replace(**dict(zip(
        ("eta", "delta", "nu_log", "theta_log", "br", "bi"), leaves[:6]))), loop)
    _backward(out.real, out.imag)
    # the fused layer, a decode step, the generic scans
    layer = samu_tune.SAMU(72, strategy="fused")
    x = torch.randn(1, 24, 144).to(torch.bfloat16).requires_grad_()
    y, _ = layer(x)
    _backward(y)
    with torch.no_grad():
        layer.step(x[:, 0].detach())
    a = torch.rand(1, 9, 5) * 0.9
    samu_tune.real_scan(a, torch.randn(1, 9, 5), strategy="serial")
    samu_tune.complex_scan(a, a, torch.randn(1, 9, 5), torch.randn(1, 9, 5), strategy="chunk")
