"""The SAMU layer: forward and every gradient against the float64 reference of the whole layer,
and ``step`` over L tokens against ``forward`` on the same tokens."""
import math

import pytest
import torch

import samu_tune
from samu_tune.ops.layer import SAMUParams, layer_reference, step_reference
from samu_tune.tolerances import TOLERANCES, check, check_all

PARAM_NAMES = ("phase_direction", "radial_direction", "phase_amplitude", "radial_amplitude",
               "nu_log", "theta_log")


def _layer(M, seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    layer = samu_tune.SAMU(M, generator=g, **kw)
    with torch.no_grad():  # off the init point so every gradient is generic
        layer.phase_amplitude.fill_(0.7)
        layer.radial_amplitude.fill_(-1.3)
    return layer


def _inputs(B, L, M, dtype, seed=1, resets=False, h0=False):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(B, L, 2 * M, generator=g, dtype=torch.float64) * 1.5).to(dtype)
    seg = None
    if resets:
        starts = torch.rand(B, L, generator=g) < 0.25
        starts[0, 0] = True
        pos = torch.zeros(B, L, dtype=torch.int64)
        for t in range(L):
            prev = pos[:, t - 1] + 1 if t else torch.full((B,), 3, dtype=torch.int64)
            pos[:, t] = torch.where(starts[:, t], torch.zeros_like(prev), prev)
        seg = pos.to(torch.int32)
    state = None
    if h0:
        state = tuple(torch.randn(B, M, generator=g) for _ in range(2))
    return x, seg, state


def _run(fn, x, state, params, upstream):
    """(y, final_r, final_i, grads of x, h0_r, h0_i and every parameter) under a random loss."""
    y, (fr, fi) = fn(x, state, params)
    gy, gr, gi = upstream
    loss = ((y.double().cpu() * gy).sum() + (fr.double().cpu() * gr).sum()
            + (fi.double().cpu() * gi).sum())
    leaves = [x, *(state or ()), *params]
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    names = ["x", *(("h0_r", "h0_i") if state else ()), *PARAM_NAMES]
    return {"y": y, "final_r": fr, "final_i": fi,
            **{"grad_" + n: g for n, g in zip(names, grads)}}


CASES = [  # B, L, M, dtype, resets, h0
    (2, 7, 5, torch.float32, False, False),
    (2, 11, 4, torch.float32, True, True),
    (1, 6, 3, torch.bfloat16, True, True),
    (3, 5, 1, torch.float32, False, True),
]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("B,L,M,dtype,resets,h0", CASES)
def test_forward_and_gradients_match_float64_reference(B, L, M, dtype, resets, h0, device):
    layer = _layer(M).to(device)
    x, seg, state = _inputs(B, L, M, dtype, resets=resets, h0=h0)
    x = x.to(device)
    seg = None if seg is None else seg.to(device)
    state = None if state is None else tuple(st.to(device) for st in state)
    g = torch.Generator().manual_seed(7)
    upstream = (torch.randn(B, L, 2 * M, generator=g, dtype=torch.float64),
                torch.randn(B, M, generator=g, dtype=torch.float64),
                torch.randn(B, M, generator=g, dtype=torch.float64))

    def module_fn(x, state, params):
        return layer(x, state, segment_pos=seg)

    def ref_fn(x, state, params):
        return layer_reference(x, SAMUParams(*params), initial_state=state, segment_pos=seg)

    x_got = x.clone().requires_grad_(True)
    s_got = None if state is None else tuple(s.clone().requires_grad_(True) for s in state)
    got = _run(module_fn, x_got, s_got, list(layer.params()), upstream)
    x_ref = x.double().requires_grad_(True)
    s_ref = None if state is None else tuple(s.double().requires_grad_(True) for s in state)
    p_ref = [p.detach().double().requires_grad_(True) for p in layer.params()]
    want = _run(ref_fn, x_ref, s_ref, p_ref, upstream)

    assert got["y"].dtype == dtype and got["y"].shape == (B, L, 2 * M)
    assert got["final_r"].dtype == torch.float32
    failures = check_all(got, want, str(dtype).removeprefix("torch."))
    assert not failures, failures
    for name in PARAM_NAMES:  # every parameter really gets a non-zero gradient
        assert float(got["grad_" + name].abs().sum()) > 0, name


def test_float64_layer_equals_reference_exactly():
    layer = _layer(3, dtype=torch.float64)
    x, seg, state = _inputs(2, 5, 3, torch.float64, resets=True, h0=True)
    state = tuple(s.double() for s in state)
    y, (fr, fi) = layer(x, state, segment_pos=seg)
    y_ref, (rr, ri) = layer_reference(x, layer.params(), initial_state=state, segment_pos=seg)
    for got, want in ((y, y_ref), (fr, rr), (fi, ri)):
        assert check("float64", got, want, TOLERANCES["float64"].forward) is None


def test_reference_formula_by_hand():
    """One token, zero state: y = relu(x * gamma), the controls only rotate later tokens."""
    M = 2
    params = _layer(M, dtype=torch.float64).params()
    params = SAMUParams(*(p.detach() for p in params))
    x = torch.randn(1, 2 * M, dtype=torch.float64)
    y, (hr, hi) = step_reference(x, params)
    gamma = torch.sqrt(1 - torch.exp(-2 * torch.exp(params.nu_log))) + 1e-8
    torch.testing.assert_close(hr[0], x[0, :M] * gamma)
    torch.testing.assert_close(y[0], torch.relu(torch.cat([hr[0], hi[0]])))
    # Second token: transition by hand from the normalised directions.
    x2 = torch.randn(1, 2 * M, dtype=torch.float64)
    _, (hr2, hi2) = step_reference(x2, params, (hr, hi))
    xa = torch.cat([x2[0], torch.ones(1, dtype=torch.float64)])
    qp = xa @ params.phase_direction / params.phase_direction.norm()
    qr = xa @ params.radial_direction / params.radial_direction.norm()
    delta = math.tanh(float(params.phase_amplitude)) * torch.tanh(qp) / math.sqrt(M)
    r = torch.tanh(qr)
    eta = math.tanh(float(params.radial_amplitude)) * r / (1 + r * r) / math.sqrt(M)
    nu, theta = torch.exp(params.nu_log), torch.exp(params.theta_log)
    a = torch.exp(-nu * torch.exp(eta)) * torch.exp(1j * (theta + delta))
    h = a * torch.complex(hr[0], hi[0]) + torch.complex(x2[0, :M], x2[0, M:]) * gamma
    torch.testing.assert_close(hr2[0], h.real)
    torch.testing.assert_close(hi2[0], h.imag)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("in_place", [False, True])
def test_step_over_tokens_equals_forward(dtype, device, in_place):
    """``in_place``: one ``out`` buffer and ``state_out=state`` for every step."""
    B, L, M = 2, 6, 5
    layer = _layer(M).to(device)
    x, _, state = _inputs(B, L, M, dtype, h0=True)
    x, state = x.to(device), tuple(st.to(device) for st in state)
    with torch.no_grad():
        y, final = layer(x, state)
        s = tuple(st.clone() for st in state)
        out = torch.empty(B, 2 * M, dtype=dtype, device=device)
        ys = []
        for t in range(L):
            if in_place:
                yt, s = layer.step(x[:, t], s, out=out, state_out=s)
                yt = yt.clone()
            else:
                yt, s = layer.step(x[:, t], s)
            ys.append(yt)
    y_steps = torch.stack(ys, dim=1)
    tol = TOLERANCES[str(dtype).removeprefix("torch.")].forward
    assert y_steps.dtype == dtype
    assert check("y", y_steps, y, tol) is None
    # fp32 states agree to rounding; with bf16 writes, the Triton 3.9 interpreter rounds the
    # kernel's write toward zero where torch rounds to nearest (one bf16 ulp per write).
    state_tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert check("final_r", s[0], final[0], state_tol) is None
    assert check("final_i", s[1], final[1], state_tol) is None


def test_step_without_state_and_differentiable_step():
    layer = _layer(3)
    x = torch.randn(2, 6, requires_grad=True)
    y, s = layer.step(x)
    y_ref, s_ref = step_reference(x.detach().double(), layer.params().to(torch.float64))
    assert check("y", y, y_ref, 1e-5) is None
    (y.sum() + s[0].sum()).backward()  # with grad enabled, step is differentiable
    assert x.grad is not None and layer.nu_log.grad is not None


def test_bad_input_names_the_problem():
    layer = _layer(3)
    with pytest.raises(ValueError, match="2M = 6"):
        layer(torch.randn(1, 4, 5))
    with pytest.raises(ValueError, match="B, 2M"):
        layer.step(torch.randn(1, 1, 6))
    with pytest.raises(ValueError, match="r_min"):
        samu_tune.SAMU(3, r_min=1.5)


# --- scan conveniences: cu_seqlens and reverse (samu_tune.ops.layer.varlen) ---

from samu_tune.ops.layer import cu_seqlens_to_segment_pos, reverse_segment_pos, varlen_scan  # noqa: E402
from samu_tune.ops.scan.verify import random_inputs  # noqa: E402
from samu_tune.ops.scan.problem import ScanProblem  # noqa: E402


def _scan_inputs(B, L, M, seed=0, h0=False):
    return random_inputs(ScanProblem(B=B, L=L, M=M, dtype="float32", device="cpu",
                                     initial_state=h0), seed=seed)


def test_cu_seqlens_to_segment_pos():
    cu = torch.tensor([0, 3, 3, 7, 8], dtype=torch.int32)
    pos = cu_seqlens_to_segment_pos(cu, 8)
    assert pos.dtype == torch.int32
    assert pos.tolist() == [[0, 1, 2, 0, 1, 2, 3, 0]]
    for bad, match in ((torch.tensor([1, 8]), "start at 0"), (torch.tensor([0, 5, 4, 8]),
                       "non-decreasing"), (torch.tensor([0, 7]), "end at L"),
                       (torch.tensor([0.0, 8.0]), "integer")):
        with pytest.raises((ValueError, TypeError), match=match):
            cu_seqlens_to_segment_pos(bad, 8)


def test_cu_seqlens_equals_segment_pos_and_separate_sequences():
    inp = _scan_inputs(1, 12, 5, seed=3)
    cu = torch.tensor([0, 4, 4, 9, 12])
    args = (inp.eta, inp.delta, inp.nu_log, inp.theta_log, inp.br, inp.bi)
    got = varlen_scan(*args, cu_seqlens=cu, output_final_state=True)
    want = samu_tune.scan(*args, segment_pos=cu_seqlens_to_segment_pos(cu, 12))
    torch.testing.assert_close(got.real, want.real)
    torch.testing.assert_close(got.imag, want.imag)
    # Each sequence alone from a zero state, and its final state.
    for n in range(4):
        lo, hi = int(cu[n]), int(cu[n + 1])
        if lo == hi:
            assert float(got.final_state[0][n].abs().sum()) == 0.0
            continue
        one = samu_tune.scan(*(t[:, lo:hi] for t in args[:2]), *args[2:4],
                             *(t[:, lo:hi] for t in args[4:]), output_final_state=True)
        torch.testing.assert_close(got.real[:, lo:hi], one.real)
        torch.testing.assert_close(got.final_state[0][n], one.final_state[0][0])
        torch.testing.assert_close(got.final_state[1][n], one.final_state[1][0])
    with pytest.raises(ValueError, match="initial_state"):
        varlen_scan(*args, cu_seqlens=cu, initial_state=(inp.br[:, 0], inp.bi[:, 0]))


def test_reverse_equals_flipping_inputs():
    inp = _scan_inputs(2, 9, 4, seed=4, h0=True)
    args = (inp.eta, inp.delta, inp.nu_log, inp.theta_log, inp.br, inp.bi)
    rev = varlen_scan(*args, initial_state=inp.initial_state, output_final_state=True,
                      reverse=True)
    flipped = samu_tune.scan(inp.eta.flip(1), inp.delta.flip(1), inp.nu_log, inp.theta_log,
                             inp.br.flip(1), inp.bi.flip(1), initial_state=inp.initial_state,
                             output_final_state=True)
    torch.testing.assert_close(rev.real, flipped.real.flip(1))
    torch.testing.assert_close(rev.imag, flipped.imag.flip(1))
    torch.testing.assert_close(rev.final_state[0], flipped.final_state[0])


def test_reverse_with_packed_sequences_reverses_each_sequence():
    inp = _scan_inputs(1, 10, 3, seed=5)
    cu = torch.tensor([0, 3, 10])
    args = (inp.eta, inp.delta, inp.nu_log, inp.theta_log, inp.br, inp.bi)
    got = varlen_scan(*args, cu_seqlens=cu, reverse=True, output_final_state=True)
    for n in range(2):
        lo, hi = int(cu[n]), int(cu[n + 1])
        part = [t[:, lo:hi].flip(1) for t in (inp.eta, inp.delta, inp.br, inp.bi)]
        one = samu_tune.scan(part[0], part[1], inp.nu_log, inp.theta_log, part[2], part[3],
                             output_final_state=True)
        torch.testing.assert_close(got.real[:, lo:hi], one.real.flip(1))
        torch.testing.assert_close(got.final_state[0][n], one.final_state[0][0])
    # Same through segment_pos: reversed starts are the tokens before each forward start.
    seg = cu_seqlens_to_segment_pos(cu, 10)
    assert reverse_segment_pos(seg).flip(1)[0].eq(0).nonzero().flatten().tolist() == [2]
    via_seg = varlen_scan(*args, segment_pos=seg, reverse=True)
    torch.testing.assert_close(via_seg.real, got.real)


def test_layer_with_cu_seqlens_matches_separate_calls():
    layer = _layer(3)
    x = torch.randn(1, 9, 6)
    cu = torch.tensor([0, 5, 9])
    y, (hr, hi) = layer(x, cu_seqlens=cu)
    assert hr.shape == (2, 3)
    for n in range(2):
        lo, hi_ = int(cu[n]), int(cu[n + 1])
        y_n, (r_n, i_n) = layer(x[:, lo:hi_])
        torch.testing.assert_close(y[:, lo:hi_], y_n)
        torch.testing.assert_close(hr[n], r_n[0])
        torch.testing.assert_close(hi[n], i_n[0])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("B,L,M,dtype,resets,h0", [
    (2, 40, 72, torch.bfloat16, True, True),      # M % 8 == 0: the aligned binary
    (1, 37, 67, torch.float32, False, False),     # ragged L and M
    (2, 33, 80, torch.float32, True, False),
])
def test_fused_forward_matches_reference_and_unfused(B, L, M, dtype, resets, h0, device):
    from samu_tune.ops.layer import fused
    from samu_tune.settings import settings
    if device == "cpu" and not settings().interpret:
        pytest.skip("the fused kernel on CPU tensors needs TRITON_INTERPRET=1")
    x, seg, state = _inputs(B, L, M, dtype, resets=resets, h0=h0)
    x = x.to(device)
    seg = None if seg is None else seg.to(device)
    state = None if state is None else tuple(s.to(device) for s in state)
    fused_layer = _layer(M, strategy="fused").to(device)
    unfused = _layer(M).to(device)
    assert fused.config_for(x, seg, h0) is not None      # the fused path really runs
    with torch.no_grad():
        y, (fr, fi) = fused_layer(x, state, segment_pos=seg)
        y_u, (ur, ui) = unfused(x, state, segment_pos=seg)
    y_ref, (rr, ri) = layer_reference(x.double(), SAMUParams(*[p.double() for p in
                                                              unfused.params()]),
                                      initial_state=None if state is None else
                                      tuple(s.double() for s in state), segment_pos=seg)
    tol = TOLERANCES[str(dtype).removeprefix("torch.")]
    assert y.dtype == dtype and y.shape == (B, L, 2 * M) and fr.dtype == torch.float32
    failures = [r for r in (
        check("y", y, y_ref, tol.forward),
        check("final_r", fr, rr, max(tol.forward, TOLERANCES["float32"].forward)),
        check("final_i", fi, ri, max(tol.forward, TOLERANCES["float32"].forward)),
        check("y vs unfused", y, y_u, tol.forward),
        check("final_r vs unfused", fr, ur, TOLERANCES["float32"].forward)) if r]
    assert not failures, failures
    assert bool((y >= 0).all()) and float(y.float().abs().sum()) > 0


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("B,L,M,dtype,resets,h0", [
    (2, 40, 72, torch.float32, True, True),
    (1, 37, 67, torch.bfloat16, False, True),
])
def test_fused_gradients_match_float64_reference(B, L, M, dtype, resets, h0, device):
    """The fused layer's backward (relu mask, write derivative, d gamma in the scan kernel;
    the controller's backward kernel adding into grad x): every gradient against the float64
    layer reference in fp32; in bf16 against the unfused layer (same rounding boundaries: the
    controller's parameter gradients sum bf16-rounded terms, and the unfused path is itself
    6-10% off the float64 reference at this size, so the reference cannot tell a bug from
    rounding)."""
    from samu_tune.ops.layer import fused
    from samu_tune.settings import settings
    if device == "cpu" and not settings().interpret:
        pytest.skip("the fused kernel on CPU tensors needs TRITON_INTERPRET=1")
    layer = _layer(M, strategy="fused").to(device)
    x, seg, state = _inputs(B, L, M, dtype, resets=resets, h0=h0)
    x = x.to(device)
    seg = None if seg is None else seg.to(device)
    state = None if state is None else tuple(s.to(device) for s in state)
    assert fused.config_for(x, seg, h0, backward=True) is not None
    g = torch.Generator().manual_seed(7)
    upstream = (torch.randn(B, L, 2 * M, generator=g, dtype=torch.float64),
                torch.randn(B, M, generator=g, dtype=torch.float64),
                torch.randn(B, M, generator=g, dtype=torch.float64))
    calls = []
    real = fused.forward

    def module_fn(x, state, params):
        return layer(x, state, segment_pos=seg)

    def ref_fn(x, state, params):
        return layer_reference(x, SAMUParams(*params), initial_state=state, segment_pos=seg)

    def counting(*args, **kw):
        out = real(*args, **kw)
        calls.append(out is not None)
        return out
    x_got = x.clone().requires_grad_(True)
    s_got = None if state is None else tuple(s.clone().requires_grad_(True) for s in state)
    fused.forward = counting
    try:
        got = _run(module_fn, x_got, s_got, list(layer.params()), upstream)
    finally:
        fused.forward = real
    assert calls == [True]                                 # the fused path ran, with autograd
    if dtype == torch.float32:
        x_ref = x.double().requires_grad_(True)
        s_ref = None if state is None else tuple(s.double().requires_grad_(True) for s in state)
        p_ref = [p.detach().double().requires_grad_(True) for p in layer.params()]
        want = _run(ref_fn, x_ref, s_ref, p_ref, upstream)
    else:
        unfused = _layer(M).to(device)
        x_u = x.clone().requires_grad_(True)
        s_u = None if state is None else tuple(s.clone().requires_grad_(True) for s in state)
        want = _run(lambda x, state, params: unfused(x, state, segment_pos=seg), x_u, s_u,
                    list(unfused.params()), upstream)
    failures = check_all(got, want, str(dtype).removeprefix("torch."))
    assert not failures, failures
    for name in PARAM_NAMES:
        assert float(got["grad_" + name].abs().sum()) > 0, name


def test_fused_strategy_falls_back_where_it_cannot_run():
    from samu_tune.ops.layer import fused
    layer = _layer(8, strategy="fused")
    x, _, _ = _inputs(1, 40, 8, torch.float32)
    # M <= 64: no loop-inner config, the unfused path
    assert fused.config_for(x, None, False) is None
    assert fused.forward(x, layer.params()) is None
    y, _ = layer(x)
    assert y.shape == x.shape
    layer = _layer(72, strategy="fused")
    x, _, _ = _inputs(1, 40, 72, torch.float32)
    # a bad segment_pos still gets the unfused path's clear error
    with pytest.raises(ValueError, match="segment_pos"):
        with torch.no_grad():
            layer(x, segment_pos=torch.zeros(1, 39, dtype=torch.int32))
    with pytest.raises(ValueError, match="unknown layer strategy"):
        samu_tune.SAMU(4, strategy="fastest")


def test_fused_layer_walks_one_row_per_step_at_four_lanes():
    # two rows per step at 4 lanes per thread would take the fused backward to 182 registers
    # (unmeasured): the fused layer runs such a scan decision with one row
    from samu_tune.ops.layer import fused as fused_mod
    from samu_tune.ops.scan.problem import ScanProblem
    from samu_tune.ops.scan.strategies.lookback import LookbackConfig
    problem = ScanProblem(B=2, L=256, M=512, dtype="bfloat16", device="cpu", final_state=True)
    four = {"chunk": 64, "block_m": 512, "num_warps": 4, "inner": "loop", "rows": 2}
    two = {"chunk": 64, "block_m": 256, "num_warps": 4, "inner": "loop", "rows": 2}
    # the forced config itself, one field changed (not a fallback to the look-back default)
    want = LookbackConfig(**{**four, "rows": 1})
    assert fused_mod.config_for_problem(problem, ("lookback", four)) == want
    assert fused_mod.config_for_problem(problem, ("lookback", two)) == LookbackConfig(**two)


def test_fused_layer_runs_the_measured_unstaged_walk():
    # a staged scan decision (software-pipeline stages, not yet timed fused on a GPU) and the
    # staged look-back default both reach the fused layer as the register-prefetch walk
    from samu_tune.ops.layer import fused as fused_mod
    from samu_tune.ops.scan.problem import ScanProblem
    from samu_tune.ops.scan.strategies import lookback as lb
    problem = ScanProblem(B=2, L=256, M=512, dtype="bfloat16", device="cpu", final_state=True)
    staged = {"chunk": 64, "block_m": 256, "num_warps": 4, "inner": "loop", "rows": 2,
              "stages": 6}
    assert fused_mod.config_for_problem(problem, ("lookback", staged)) == \
        lb.LookbackConfig(**{**staged, "stages": 1})
    assert lb.default(problem).stages > 1
    assert fused_mod._loop_config(problem).stages > 1
    assert fused_mod.config_for_problem(problem, "lookback").stages == 1


def test_fused_no_grad_operands_cached_until_a_parameter_changes():
    # inference: the fused layer's parameter operands (unit directions, amplitude scales,
    # gamma) are computed once per parameter version, with the same values as per call
    torch.manual_seed(0)
    layer = samu_tune.SAMU(72, strategy="fused", generator=torch.Generator().manual_seed(3))
    x = torch.randn(2, 40, 144)
    cache = layer._fused_operands
    with torch.no_grad():
        y1, s1 = layer(x)
        y2, _ = layer(x)
    assert cache.builds == 1
    assert torch.equal(y1, y2)
    y_grad, s_grad = layer(x)                    # grad mode: operands per call, same values
    assert torch.equal(y_grad.detach(), y1) and torch.equal(s_grad[0].detach(), s1[0])
    assert cache.builds == 1
    with torch.no_grad():
        layer.phase_direction.add_(0.5)           # an optimizer-style in-place update
        layer.nu_log.mul_(1.1)
        y3, _ = layer(x)
    assert cache.builds == 2
    assert not torch.equal(y3, y1)
    y_fresh, _ = layer(x)                         # recomputed per call with gradients on
    assert torch.equal(y_fresh.detach(), y3)
    copy = __import__("copy").deepcopy(layer)
    with torch.no_grad():
        assert torch.equal(copy(x)[0], y3) and copy._fused_operands.builds == 1


@pytest.mark.skipif(not samu_tune.settings.settings().interpret and not torch.cuda.is_available(),
                    reason="the fused kernels need a GPU or the interpreter")
def test_fused_layer_params_equals_fused_layer_and_names_bad_input():
    # the training path's one Function (operands kernel inside) against the operands kernel's
    # own Function feeding FusedLayer: same outputs and parameter gradients
    from samu_tune.ops.layer import fused as fused_mod, fused_autograd
    from samu_tune.ops.layer import operands as operand_kernels
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(3)
    layer = _layer(80).to(device)
    x = torch.randn(2, 70, 160, device=device)
    cfg = fused_mod.config_for(x, None, False, backward=True)
    g = torch.randn_like(x)
    results = []
    for path in ("params", "operands"):
        leaves = [x.clone().requires_grad_(True)] + [
            p.detach().clone().requires_grad_(True) for p in layer.params()]
        xx, pd, rd, pa, ra, nu, th = leaves
        if path == "params":
            y, (hr, hi) = fused_autograd.fused_layer_params(xx, pd, rd, pa, ra, nu, th, cfg)
        else:
            dirs, scales, gamma = operand_kernels.operands(pd, rd, pa, ra, nu)
            y, (hr, hi) = fused_autograd.fused_layer(xx, dirs, scales, gamma, nu, th, cfg)
        (y * g).sum().add_((hr + hi).sum()).backward()
        results.append([y, hr, hi] + [t.grad for t in leaves])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    pd, rd, pa, ra, nu, th = layer.params()
    with pytest.raises(ValueError, match="strided"):
        fused_autograd.fused_layer_params(x[:, :, :160].transpose(0, 1).contiguous()
                                          .transpose(0, 1), pd, rd, pa, ra, nu, th, cfg)
    with pytest.raises(ValueError, match="phase direction"):
        fused_autograd.fused_layer_params(x, pd[:-1], rd, pa, ra, nu, th, cfg)
