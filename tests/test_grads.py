"""Shared autograd plumbing of the Triton strategies (samu_tune/autograd.py)."""
import pytest
import torch

from samu_tune import autograd as _grads


@pytest.mark.parametrize("shape", [(2, 37, 2), (3, 5, 7), (1, 1, 1), (4, 129, 3)])
def test_stacked_halves_are_16_byte_aligned_views(shape):
    # Triton specialises pointer arguments on 16-byte alignment: an unaligned second half
    # (offset prod(shape) * 4 bytes) compiled another binary for some shapes on the H200
    pair = _grads.Stacked.empty(*shape, dtype=torch.float32, device="cpu")
    assert all(p.data_ptr() % 16 == 0 for p in pair)
    assert all(p.shape == shape and p.is_contiguous() for p in pair)
    pair[0].copy_(torch.arange(pair[0].numel(), dtype=torch.float32).view(shape))
    pair[1].copy_(-torch.arange(pair[1].numel(), dtype=torch.float32).view(shape))
    assert torch.equal(pair.whole[0], pair[0]) and torch.equal(pair.whole[1], pair[1])


def test_sum_partials_reduces_each_half():
    ctl = _grads.Stacked.empty(2, 3, 5, dtype=torch.float32, device="cpu")
    spec = _grads.Stacked.empty(2, 4, 7, dtype=torch.float32, device="cpu")
    for p in (*ctl, *spec):
        p.copy_(torch.randn(p.shape))
    g_eta, g_delta, g_nu, g_theta = _grads.sum_partials(ctl, spec)
    torch.testing.assert_close(g_eta, ctl[0].sum(-1))
    torch.testing.assert_close(g_delta, ctl[1].sum(-1))
    torch.testing.assert_close(g_nu, spec[0].sum((0, 1)))
    torch.testing.assert_close(g_theta, spec[1].sum((0, 1)))
    one = _grads.Stacked.empty(2, 3, 1, dtype=torch.float32, device="cpu")
    one.whole.copy_(torch.randn(2, 2, 3, 1))
    torch.testing.assert_close(_grads.sum_partials(one, spec)[1], one[1][..., 0])


class _Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_apply_builds_the_node_through_the_c_entry_point_with_the_same_gradients():
    # the C entry point is the one Function.apply ends in: same node type, same gradients
    assert _grads._c_apply(_Double) is not _Double.apply
    x = torch.randn(5, requires_grad=True)
    y = _grads.apply(_Double, x)
    assert type(y.grad_fn).__name__ == "_DoubleBackward"
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((5,), 2.0))
    with torch.no_grad():                  # no gradient: the forward alone, no node
        assert _grads.apply(_Double, x).grad_fn is None


def test_apply_under_a_functorch_transform_goes_through_function_apply():
    # Function.apply's own check runs there: these Functions define no setup_context
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.grad(lambda x: _grads.apply(_Double, x).sum())(torch.randn(3))
