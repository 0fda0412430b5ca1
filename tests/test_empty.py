"""Empty inputs (a size of 0) behave as torch ops do: empty outputs, the state passes through,
gradients of the right shapes; no kernel, dispatch or tuning runs for them."""
import pytest
import torch

import samu_tune
from samu_tune import dispatch


def _scan_args(B, L, M, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(B, L, generator=g) * 0.5, torch.randn(B, L, generator=g) * 0.5,
            -torch.rand(M, generator=g) - 0.1, torch.rand(M, generator=g),
            torch.randn(B, L, M, generator=g).to(dtype),
            torch.randn(B, L, M, generator=g).to(dtype)]
    return [a.requires_grad_(True) for a in args]


@pytest.mark.parametrize("shape", [(0, 8, 4), (2, 0, 4), (2, 8, 0)])
def test_scan_of_an_empty_dimension(shape, monkeypatch):
    monkeypatch.setattr(dispatch, "decide", lambda *a, **k: pytest.fail("dispatched"))
    B, L, M = shape
    args = _scan_args(B, L, M)
    h0 = (torch.randn(B, M, requires_grad=True), torch.randn(B, M, requires_grad=True))
    out = samu_tune.scan(*args, initial_state=h0, output_final_state=True,
                         segment_pos=torch.ones(B, L, dtype=torch.int32))
    assert out.real.shape == out.imag.shape == (B, L, M) and out.real.dtype == torch.bfloat16
    h_r, h_i = out.final_state
    assert h_r.shape == (B, M) and h_r.dtype == torch.float32
    if L == 0:                               # no step: the final state is the initial one
        torch.testing.assert_close(h_r, h0[0].detach())
    (out.real.float().sum() + out.imag.float().sum() + 3 * h_r.sum() + h_i.sum()).backward()
    assert all(a.grad is not None and a.grad.shape == a.shape for a in args)
    if L == 0:
        torch.testing.assert_close(h0[0].grad, torch.full((B, M), 3.0))
    # no initial state: zeros
    plain = samu_tune.scan(*[a.detach() for a in args], output_final_state=True)
    assert not plain.final_state[0].any()
    assert plain.real.data_ptr() != args[4].data_ptr() or not plain.real.numel()


def test_scan_of_an_empty_sequence_under_torch_compile():
    args = _scan_args(2, 0, 4)

    def f(*a):
        out = samu_tune.scan(*a, output_final_state=True)
        return out.real, out.final_state[0]

    real, h = torch.compile(f, backend="aot_eager", fullgraph=True)(*args)
    assert real.shape == (2, 0, 4) and h.shape == (2, 4) and not h.any()


@pytest.mark.parametrize("shape", [(2, 0, 8), (0, 5, 8)])
def test_layer_of_an_empty_batch_or_sequence(shape):
    layer = samu_tune.SAMU(modes=4)
    x = torch.randn(*shape, requires_grad=True)
    state = (torch.randn(shape[0], 4, requires_grad=True), torch.randn(shape[0], 4))
    y, (h_r, h_i) = layer(x, state)
    assert y.shape == shape and h_r.shape == (shape[0], 4) and h_r.dtype == torch.float32
    (y.sum() + h_r.sum()).backward()
    assert x.grad.shape == shape
    if shape[1] == 0:
        torch.testing.assert_close(h_r, state[0].detach())
        torch.testing.assert_close(state[0].grad, torch.ones(shape[0], 4))


def test_decode_step_of_an_empty_batch():
    layer = samu_tune.SAMU(modes=4)
    with torch.no_grad():
        y, (h_r, h_i) = layer.step(torch.randn(0, 8))
    assert y.shape == (0, 8) and h_r.shape == (0, 4)


@pytest.mark.parametrize("shape", [(0, 5, 3), (2, 0, 3), (2, 5, 0)])
def test_linear_scans_of_an_empty_dimension(shape):
    a = torch.rand(*shape, requires_grad=True)
    b = torch.randn(*shape, requires_grad=True)
    h0 = torch.randn(shape[0], shape[2], requires_grad=True)
    out = samu_tune.real_scan(a, b, initial_state=h0, output_final_state=True)
    assert out.out.shape == shape and out.final_state.shape == (shape[0], shape[2])
    (out.out.sum() + 2 * out.final_state.sum()).backward()
    assert a.grad.shape == shape and b.grad.shape == shape
    if shape[1] == 0:
        torch.testing.assert_close(h0.grad, torch.full_like(h0, 2.0))
    c = samu_tune.complex_scan(a.detach(), a.detach(), b.detach(), b.detach(),
                               output_final_state=True, reverse=True)
    assert c.real.shape == shape and c.final_state[0].shape == (shape[0], shape[2])


def test_empty_inputs_keep_the_checks_and_return_new_tensors():
    B, L, M = 2, 0, 4
    args = [a.detach() for a in _scan_args(B, L, M, dtype=torch.float32)]
    h0 = (torch.randn(B, M), torch.randn(B, M))
    out = samu_tune.scan(*args, initial_state=h0, output_final_state=True)
    assert out.final_state[0] is not h0[0] and out.final_state[0].data_ptr() != h0[0].data_ptr()
    # the final state's dtype is a kernel's (fp32) whatever h0's
    wide = (h0[0].double(), h0[1].double())
    assert samu_tune.scan(*args, initial_state=wide,
                          output_final_state=True).final_state[0].dtype == torch.float32
    with pytest.raises(ValueError, match="unknown strategy"):
        samu_tune.scan(*args, strategy="nope")
    with pytest.raises(ValueError, match=r"initial_state\[0\] must have shape"):
        samu_tune.scan(*args, initial_state=(torch.zeros(5, M), torch.zeros(5, M)))
    layer = samu_tune.SAMU(modes=M)
    with pytest.raises(ValueError, match=r"initial_state\[0\] must have shape"):
        layer(torch.randn(B, 0, 2 * M), (torch.zeros(5, M), torch.zeros(5, M)))
    with pytest.raises(ValueError, match=r"segment_pos must have shape"):
        layer(torch.randn(B, 0, 2 * M), segment_pos=torch.zeros(B, 3, dtype=torch.int32))
    # a packed row without tokens: every sequence's state is zero
    y, (h_r, _) = layer(torch.randn(1, 0, 2 * M), cu_seqlens=torch.tensor([0, 0, 0]))
    assert y.shape == (1, 0, 2 * M) and h_r.shape == (2, M) and not h_r.any()
    lin = samu_tune.real_scan(torch.rand(B, 0, M), torch.rand(B, 0, M),
                              initial_state=torch.randn(B, M, dtype=torch.float64),
                              output_final_state=True)
    assert lin.final_state.dtype == torch.float32


def test_an_empty_batch_runs_no_step_loop():
    import time
    args = _scan_args(0, 20000, 4)
    t = time.perf_counter()
    out = samu_tune.scan(*args, output_final_state=True)
    (out.real.float().sum() + out.final_state[0].sum()).backward()
    assert out.real.shape == (0, 20000, 4) and time.perf_counter() - t < 2.0


def test_explain_says_an_empty_input_runs_the_reference():
    with pytest.raises(ValueError, match="runs the torch reference"):
        samu_tune.explain(*[a.detach() for a in _scan_args(2, 0, 4)])
