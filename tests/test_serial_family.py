"""The serial family (``serial``, ``precomputed_decay``) beyond the registry-generated checks:
several mode tiles with a ragged last one, a reset at t = 0 with an initial state, bf16
controls with fp16 writes, gradients through the final state only, determinism, the config
space, workspace, the decay pass, and (GPU) one compiled binary for every shape.
"""
import pytest
import torch

from samu_tune import registry
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.strategies import serial as serial_strategy
from samu_tune.ops.scan.strategies.serial import SerialConfig
from samu_tune.ops.scan.verify import random_inputs

from _helpers import (assert_final_state_grads_match_reference, assert_forward_only_under_no_grad,
                      assert_reset_at_t0_cuts_h0_off, binaries_over_shapes, check as _check,
                      cpu_problem as _problem, grads)

FAMILY = ("serial", "precomputed_decay")


@pytest.mark.parametrize("name", FAMILY)
def test_several_mode_tiles_with_a_ragged_last_tile(name):
    # M = 37 over 16-mode tiles: 3 programs per row, the last holding 5 modes
    problem = _problem(2, 11, 37, dtype="float32", resets=True, initial_state=True,
                       final_state=True)
    _check(name, SerialConfig(block_m=16, num_warps=1), problem)


@pytest.mark.parametrize("name", FAMILY)
def test_reset_at_t0_zeroes_the_initial_state_gradient(name):
    problem = _problem(2, 6, 5, dtype="float32", resets=True, initial_state=True,
                       final_state=True)
    inputs = random_inputs(problem, seed=3)
    seg = torch.tensor([[0, 1, 2, 0, 1, 2], [5, 6, 0, 1, 2, 3]], dtype=torch.int32)
    inputs = inputs.replace(segment_pos=seg)
    cfg = SerialConfig(block_m=16, num_warps=1)
    _check(name, cfg, problem, inputs=inputs, seed=3)
    # row 1 has no reset at t = 0
    assert_reset_at_t0_cuts_h0_off(lambda inp: registry.get(name).run(inp, cfg), inputs)


@pytest.mark.parametrize("name", FAMILY)
def test_bf16_controls_with_fp16_writes(name):
    problem = _problem(2, 9, 19, dtype="float16", control_dtype="bfloat16", resets=True,
                       final_state=True)
    inputs = random_inputs(problem, seed=5)
    cfg = SerialConfig(block_m=16, num_warps=1, num_stages=2, unroll=4)
    out = registry.get(name).run(inputs, cfg)
    assert out.real.dtype == torch.float16 and out.final_state[0].dtype == torch.float32
    _check(name, cfg, problem, inputs=inputs, seed=5)


@pytest.mark.parametrize("name", FAMILY)
def test_gradient_through_the_final_state_only(name):
    problem = _problem(2, 8, 6, dtype="float32", initial_state=True, final_state=True)
    inputs = random_inputs(problem, seed=2)
    cfg = serial_strategy.default(problem)
    assert_final_state_grads_match_reference(lambda inp: registry.get(name).run(inp, cfg), inputs)


@pytest.mark.parametrize("name", FAMILY)
def test_forward_only_under_no_grad(name):
    problem = _problem(1, 5, 4, dtype="bfloat16", final_state=True, backward=False)
    inputs = random_inputs(problem, seed=1)
    assert_forward_only_under_no_grad(
        lambda inp: registry.get(name).run(inp, SerialConfig(block_m=16)), inputs)


@pytest.mark.parametrize("name", FAMILY)
def test_backward_is_bitwise_reproducible(name):
    problem = _problem(2, 10, 40, dtype="float32", resets=True, initial_state=True,
                       final_state=True)
    inputs = random_inputs(problem, seed=4)
    cfg = SerialConfig(block_m=16, num_warps=1)

    def run():
        return grads(lambda inp: registry.get(name).run(inp, cfg), inputs,
                     lambda out: out.real.sum() + 3 * out.imag.sum() + out.final_state[1].sum())

    for a, b in zip(run(), run()):
        assert torch.equal(a, b)


def test_config_space_is_pruned_and_default_is_valid():
    strat = registry.get("serial")
    for M in (1, 5, 20, 100, 1000):
        for L in (1, 3, 100):
            problem = _problem(2, L, M)
            configs = strat.configs(problem)
            assert configs, (L, M)
            assert strat.default_config(problem) in configs
            for cfg in configs:
                assert cfg.num_warps * 32 <= max(cfg.block_m, 32)
                assert cfg.unroll <= L and cfg.num_stages <= L
    small = strat.configs(_problem(2, 8, 20))
    assert {c.block_m for c in small} == {16, 32}
    big = strat.configs(_problem(2, 8, 1000))
    assert {c.block_m for c in big} == {16, 32, 64, 128, 256}
    assert SerialConfig(block_m=64, num_warps=8) not in big
    assert SerialConfig(block_m=256, num_warps=8) in big


def test_capability_is_deterministic_and_honest():
    for name in FAMILY:
        cap = registry.get(name).capability
        assert cap.deterministic and cap.triton and cap.devices == {"cuda"}
        assert cap.dtypes == {"float32", "bfloat16", "float16"}
        assert cap.control_dtypes == {"float32", "bfloat16"}
        det = ScanProblem(B=1, L=4, M=4, deterministic=True)
        assert not cap.reasons(det)


def test_workspace_reports_the_decay_buffer():
    problem = ScanProblem(B=2, L=100, M=64, backward=True)
    cfg = SerialConfig(block_m=32)
    serial_ws = registry.get("serial").workspace_bytes(problem, cfg)
    decay_ws = registry.get("precomputed_decay").workspace_bytes(problem, cfg)
    assert serial_ws == 4 * (2 * 2 * 100 * 2 + 4 * 2 * 64)
    assert decay_ws - serial_ws == 4 * 2 * 100 * 64
    forward = problem.model_copy(update={"backward": False})
    assert registry.get("serial").workspace_bytes(forward, cfg) == 0


def test_radial_decay_kernel():
    # rows and modes that no tile divides
    eta = torch.randn(3, 11) * 0.5
    nu_log = torch.rand(130).clamp_min(0.02).log()
    rho = serial_strategy.radial_decay(eta, nu_log, 130)
    want = torch.exp(-nu_log.exp() * eta.exp()[..., None])
    torch.testing.assert_close(rho, want, rtol=1e-6, atol=1e-7)


# ---- GPU: one binary for every shape ---------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("name", FAMILY)
@pytest.mark.parametrize("cfg", [SerialConfig(block_m=32, num_warps=1),
                                 SerialConfig(block_m=64, num_warps=2, num_stages=4, unroll=4)],
                         ids=["plain", "pipelined"])
def test_a_new_shape_does_not_recompile(name, cfg):
    from samu_tune.kernels import decay, serial as serial_kernels
    from samu_tune.settings import settings
    if settings().interpret:
        pytest.skip("counts compiled binaries: needs TRITON_INTERPRET=0")
    kernels = [serial_kernels.serial_scan] + ([decay.radial_decay] if name == "precomputed_decay"
                                              else [])
    # L and M differ in divisibility by 16 and in being 1: what Triton would specialise on
    shapes = [(2, 37, 20), (3, 64, 48), (1, 1, 1), (4, 129, 97)]
    counts = binaries_over_shapes(lambda inp: registry.get(name).run(inp, cfg), kernels, shapes,
                                  f"{name} ")
    assert counts[0][0] >= 2, counts      # at least forward and reverse of serial_scan
    assert all(c == counts[0] for c in counts[1:]), counts
