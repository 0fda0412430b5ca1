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
