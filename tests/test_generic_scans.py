"""samu_tune.real_scan / complex_scan: every strategy against naive loops, with gradients
(a, b, h0, through the final state), initial and final state, and reverse."""
import pytest
import torch

import samu_tune
from samu_tune.ops.linear import ChunkConfig, SerialConfig
from samu_tune.tolerances import TOLERANCES, check

STRATEGIES = [
    "reference",
    "serial",
    ("serial", SerialConfig(block_d=16)),
    "chunk",
    ("chunk", ChunkConfig(chunk=16, block_d=16)),
]


def naive(a, b, h0, reverse):
    """h[t] = a[t] h[t-1] + b[t] in complex128 (a, b complex [B, L, D]); returns (out, last)."""
    B, L, D = a.shape
    h = torch.zeros(B, D, dtype=a.dtype) if h0 is None else h0
    out = [None] * L
    for t in (reversed(range(L)) if reverse else range(L)):
        h = a[:, t] * h + b[:, t]
        out[t] = h
    return torch.stack(out, 1), h


def _data(B, L, D, dtype, complex_, h0, seed):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

    n = 2 if complex_ else 1
    # |a| below 1 (but not tiny) so the recurrence neither explodes nor forgets at once.
    mag = 0.6 + 0.35 * torch.rand(B, L, D, generator=g, dtype=torch.float64)
    ang = rnd(B, L, D)
    a = [mag * torch.cos(ang), mag * torch.sin(ang)][:n]
    b = [rnd(B, L, D) for _ in range(n)]
    s = [rnd(B, D).float() for _ in range(n)] if h0 else None
    up = [rnd(B, L, D) for _ in range(n)] + [rnd(B, D) for _ in range(n)]
    return [t.to(dtype) for t in a], [t.to(dtype) for t in b], s, up


def _leaves(ts, dtype=None, device="cpu"):
    return None if ts is None else [
        (t.detach().clone() if dtype is None else t.detach().to(dtype)).to(device)
        .requires_grad_(True) for t in ts]


def _call(fn_complex, a, b, h0, reverse, strategy):
    if fn_complex:
        res = samu_tune.complex_scan(*a, *b, initial_state=None if h0 is None else tuple(h0),
                                     output_final_state=True, reverse=reverse,
                                     strategy=strategy)
        return [res.real, res.imag], list(res.final_state)
    res = samu_tune.real_scan(a[0], b[0], initial_state=None if h0 is None else h0[0],
                              output_final_state=True, reverse=reverse, strategy=strategy)
    return [res.out], [res.final_state]


CASES = [  # B, L, D, dtype, complex, h0, reverse
    (2, 7, 5, torch.float32, False, False, False),
    (2, 37, 3, torch.float32, False, True, True),
    (1, 40, 20, torch.bfloat16, False, True, False),
    (2, 9, 6, torch.float32, True, True, False),
    (1, 37, 17, torch.float32, True, True, True),
    (2, 5, 1, torch.float16, True, False, True),
    (1, 1, 3, torch.float32, True, True, False),
]


@pytest.mark.parametrize("strategy", STRATEGIES, ids=str)
@pytest.mark.parametrize("B,L,D,dtype,complex_,h0,reverse", CASES)
def test_matches_naive_loop(strategy, B, L, D, dtype, complex_, h0, reverse):
    _compare(strategy, B, L, D, dtype, complex_, h0, reverse, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", STRATEGIES[1:], ids=str)
@pytest.mark.parametrize("B,L,D,dtype,complex_,h0,reverse", CASES + [
    (3, 700, 300, torch.bfloat16, True, True, False),
    (2, 513, 129, torch.float32, False, True, True),
])
def test_matches_naive_loop_cuda(strategy, B, L, D, dtype, complex_, h0, reverse):
    _compare(strategy, B, L, D, dtype, complex_, h0, reverse, "cuda")


def _compare(strategy, B, L, D, dtype, complex_, h0, reverse, device):
    a, b, s, up = _data(B, L, D, dtype, complex_, h0, seed=B * 1000 + L * 10 + D)
    got_in = (_leaves(a, device=device), _leaves(b, device=device), _leaves(s, device=device))
    outs, last = _call(complex_, *got_in, reverse, strategy)
    n = len(outs)
    assert outs[0].dtype == dtype and outs[0].shape == (B, L, D)
    assert last[0].dtype == torch.float32 and last[0].shape == (B, D)
    loss = sum((o.double().cpu() * u).sum() for o, u in zip(outs + last, up))
    leaves = got_in[0] + got_in[1] + (got_in[2] or [])
    got_grads = torch.autograd.grad(loss, leaves)

    # The naive loop in complex128 on the same (rounded) inputs.
    ref_in = (_leaves(a, torch.float64), _leaves(b, torch.float64), _leaves(s, torch.float64))
    cplx = (lambda p: torch.complex(p[0], p[1])) if complex_ else (lambda p: p[0] + 0j)
    out_c, last_c = naive(cplx(ref_in[0]), cplx(ref_in[1]),
                          None if s is None else cplx(ref_in[2]), reverse)
    want_outs = [out_c.real, out_c.imag][:n]
    want_last = [last_c.real, last_c.imag][:n]
    loss_ref = sum((o * u).sum() for o, u in zip(want_outs + want_last, up))
    ref_leaves = ref_in[0] + ref_in[1] + (ref_in[2] or [])
    want_grads = torch.autograd.grad(loss_ref, ref_leaves)

    tol = TOLERANCES[str(dtype).removeprefix("torch.")]
    failures = [check(f"out{i}", g, w, tol.forward) for i, (g, w) in enumerate(zip(outs, want_outs))]
    failures += [check(f"last{i}", g, w, max(tol.forward, 1e-4))
                 for i, (g, w) in enumerate(zip(last, want_last))]
    names = [f"grad_{p}{i}" for p in ("a", "b", "h0") for i in range(n)]
    for name, g, w, leaf in zip(names, got_grads, want_grads, leaves):
        assert g.dtype == leaf.dtype, name
        failures.append(check(name, g, w, tol.gradient))
    failures = [f for f in failures if f]
    assert not failures, failures


@pytest.mark.parametrize("strategy", ["serial", "chunk"])
def test_reverse_equals_flipping_inputs(strategy):
    a, b, s, _ = _data(2, 21, 4, torch.float32, True, True, seed=5)
    fwd = samu_tune.complex_scan(*(t.flip(1) for t in a + b), initial_state=tuple(s),
                                 output_final_state=True, strategy=strategy)
    rev = samu_tune.complex_scan(*a, *b, initial_state=tuple(s), output_final_state=True,
                                 reverse=True, strategy=strategy)
    torch.testing.assert_close(rev.real, fwd.real.flip(1))
    torch.testing.assert_close(rev.imag, fwd.imag.flip(1))
    torch.testing.assert_close(rev.final_state[0], fwd.final_state[0])


def test_only_final_state_used_and_no_state_requested():
    """Gradient only through the final state (outputs unused), and outputs only."""
    a, b, s, _ = _data(1, 19, 3, torch.float32, False, True, seed=9)
    a_, b_, s_ = _leaves(a), _leaves(b), _leaves(s)
    res = samu_tune.real_scan(a_[0], b_[0], initial_state=s_[0], output_final_state=True,
                              strategy="chunk")
    res.final_state.sum().backward()
    a64, b64, s64 = _leaves(a, torch.float64), _leaves(b, torch.float64), _leaves(s, torch.float64)
    ref = samu_tune.real_scan(a64[0], b64[0], initial_state=s64[0], output_final_state=True,
                              strategy="reference")
    ref.final_state.sum().backward()
    for got, want in ((a_[0].grad, a64[0].grad), (b_[0].grad, b64[0].grad),
                      (s_[0].grad, s64[0].grad)):
        assert check("grad", got, want, 1e-4) is None
    out = samu_tune.real_scan(a[0], b[0], strategy="serial")
    assert out.final_state is None


def test_auto_and_errors():
    a = torch.rand(2, 8, 4)
    assert samu_tune.real_scan(a, a).out.shape == (2, 8, 4)
    with pytest.raises(ValueError, match="b must have shape"):
        samu_tune.real_scan(a, a[:, :3])
    with pytest.raises(ValueError, match="initial_state must have shape"):
        samu_tune.real_scan(a, a, initial_state=torch.zeros(2, 5))
    with pytest.raises(ValueError, match="unknown strategy"):
        samu_tune.real_scan(a, a, strategy="fast")
    with pytest.raises(TypeError, match="bi must have"):
        samu_tune.complex_scan(a, a, a, a.double())
