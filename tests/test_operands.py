"""The layer's parameter-operand kernels (samu_tune.ops.layer.operands) against torch."""
from __future__ import annotations

import pytest
import torch

import samu_tune
from samu_tune.ops.layer import fused


@pytest.mark.parametrize("M", [1, 5, 80, 700])
@pytest.mark.parametrize("zero_direction", [False, True])
def test_operands_kernel_matches_torch_forward_and_backward(M, zero_direction):
    layer = samu_tune.SAMU(modes=M, generator=torch.Generator().manual_seed(M))
    with torch.no_grad():
        layer.phase_direction.mul_(3.0)
        layer.phase_amplitude.fill_(-0.7)
        if zero_direction:
            layer.radial_direction.zero_()
    params = layer.params()
    got, want = fused.operands(params), fused.operands_torch(params)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == torch.float32 and g.is_contiguous()
        # gamma = sqrt(1 - exp(-2 nu)) cancels at small nu: ~1e-5 relative between exp
        # implementations (torch and Triton alike against float64)
        torch.testing.assert_close(g, w, rtol=5e-5, atol=1e-6)
    weights = [torch.randn(t.shape, generator=torch.Generator().manual_seed(1)) for t in want]
    leaves = list(params)[:5]
    g_got = torch.autograd.grad(got, leaves, weights)
    g_want = torch.autograd.grad(want, leaves, weights)
    for g, w in zip(g_got, g_want):
        torch.testing.assert_close(g, w, rtol=5e-5, atol=1e-5 * float(w.abs().max()) + 1e-12)


def test_operands_without_gradients_build_no_graph():
    params = samu_tune.SAMU(modes=16).params()
    with torch.no_grad():
        dirs, scales, gamma = fused.operands(params)
    assert not dirs.requires_grad and dirs.shape == (2, 33) and gamma.shape == (16,)


@pytest.mark.parametrize("M,T", [(5, 14), (600, 14), (40, 70)])
@pytest.mark.parametrize("zero_direction", [False, True])
def test_controller_raw_forward_writes_the_operands_and_the_same_controls(M, T, zero_direction):
    """The controller's forward from the raw parameters (the fused layer's training forward)
    writes the operands kernel's dirs, scales and gamma and the controls the controller
    computes from them, bitwise: M = 600 has more operand jobs (2 + 2) than the controller
    has programs at T = 14 (one), T = 70 more programs than jobs."""
    from samu_tune.ops.layer import operands
    from samu_tune.ops.scan import controls
    layer = samu_tune.SAMU(modes=M, generator=torch.Generator().manual_seed(M))
    with torch.no_grad():
        layer.phase_direction.mul_(3.0)
        if zero_direction:
            layer.radial_direction.zero_()
    raw = [t.detach().contiguous() for t in (layer.phase_direction, layer.radial_direction,
                                             layer.phase_amplitude, layer.radial_amplitude,
                                             layer.nu_log)]
    x = torch.randn(T, 2 * M, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    seg = (torch.arange(T) % 9).to(torch.int32)
    want_ops = operands.compute(*raw)
    want = controls.forward(x, want_ops[0], want_ops[1], table=True, seg=seg)
    got_ops = operands.empty(2 * M + 1, M, x.device)
    for t in got_ops:
        t.fill_(float("nan"))
    got = controls.forward(x, got_ops[0], got_ops[1], table=True, seg=seg, checked=False,
                           raw=(*raw, got_ops[2]))
    for g, w in zip((*got_ops, *got), (*want_ops, *want)):
        assert torch.equal(g, w)


def test_the_fused_layers_training_forward_is_two_launches(monkeypatch):
    """A training forward of the fused layer launches the controller (which writes the
    operands) and the scan, nothing else: each launch is host time."""
    from samu_tune.launcher import FastKernel
    launched = []
    original = FastKernel.launch

    def recording(self, grid, args, kwargs):
        launched.append(self.fn.__name__)
        return original(self, grid, args, kwargs)

    layer = samu_tune.SAMU(72, strategy="fused", generator=torch.Generator().manual_seed(0))
    x = torch.randn(1, 40, 144, requires_grad=True)
    layer(x)                                   # decided and compiled before counting
    monkeypatch.setattr(FastKernel, "launch", recording)
    y, _ = layer(x)
    assert launched == ["controller_forward", "lookback_scan"]
    y.sum().backward()
    assert launched[2:] == ["lookback_scan", "controller_backward", "layer_operands_backward"]
