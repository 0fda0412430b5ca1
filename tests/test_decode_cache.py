"""``SAMU.step``'s host path (issue 7): digested parameters cached per parameter version,
in-place ``out=``/``state_out=``, and no torch op on a cache hit."""
import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import samu_tune
from samu_tune.kernels import decode as kernels
from samu_tune.ops.layer import SAMUParams, step_reference
from samu_tune.tolerances import TOLERANCES, check


def _layer(M=6, seed=0, **kw):
    layer = samu_tune.SAMU(M, generator=torch.Generator().manual_seed(seed), **kw)
    with torch.no_grad():
        layer.phase_amplitude.fill_(0.9)
        layer.radial_amplitude.fill_(-1.2)
    return layer


def _token(B, M, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, 2 * M, generator=g) * 1.5
    state = tuple(torch.randn(B, M, generator=g) for _ in range(2))
    return x, state


def _assert_step_is_reference(layer, x, state, **kw):
    with torch.no_grad():
        y, (hr, hi) = layer.step(x, state, **kw)
    want_y, (wr, wi) = step_reference(x.double(), layer.params().to(torch.float64),
                                      tuple(s.double() for s in state))
    for what, got, want in (("y", y, want_y), ("h_r", hr, wr), ("h_i", hi, wi)):
        reason = check(what, got, want, 1e-5)
        assert reason is None, reason
    return y, (hr, hi)


@pytest.mark.parametrize("change", ["inplace", "load_state_dict", "assign_data", "swap"])
def test_parameter_change_rebuilds_the_constants(change):
    layer, other = _layer(seed=0), _layer(seed=5)
    x, state = _token(3, 6)
    cache = layer._decoder.constants
    _assert_step_is_reference(layer, x, state)
    _assert_step_is_reference(layer, x, state)
    assert cache.builds == 1  # the second step reused the digested parameters
    with torch.no_grad():
        if change == "inplace":  # what an optimizer step does
            layer.nu_log.add_(0.4)
            layer.phase_direction.mul_(-1.0)
        elif change == "load_state_dict":
            layer.load_state_dict(other.state_dict())
        elif change == "assign_data":
            layer.theta_log.data = other.theta_log.data.clone()
        else:
            layer.radial_direction = torch.nn.Parameter(other.radial_direction.clone())
    _assert_step_is_reference(layer, x, state)
    assert cache.builds == 2


def test_untracked_write_needs_invalidate():
    """``p.data.add_`` bypasses the version counter; invalidate_decode_cache re-digests."""
    layer = _layer()
    x, state = _token(2, 6)
    with torch.no_grad():
        before, _ = layer.step(x, state)
    layer.nu_log.data.add_(0.5)
    layer.invalidate_decode_cache()
    after, _ = _assert_step_is_reference(layer, x, state)
    assert not torch.allclose(before, after)


def test_copies_do_not_share_the_cache():
    layer = _layer()
    x, state = _token(2, 6)
    with torch.no_grad():
        layer.step(x, state)
    twin = copy.deepcopy(layer)
    with torch.no_grad():
        twin.nu_log.add_(0.3)
    _assert_step_is_reference(twin, x, state)
    _assert_step_is_reference(layer, x, state)


@pytest.mark.parametrize("strategy", ["single", "blocked", "reference"])
def test_out_and_in_place_state(strategy):
    layer = _layer(decode_strategy=strategy)
    x, state = _token(2, 6)
    want_y, want_s = step_reference(x.double(), layer.params().to(torch.float64),
                                    tuple(s.double() for s in state))
    out = torch.empty_like(x)
    with torch.no_grad():
        y, new = layer.step(x, state, out=out, state_out=state)
    assert y is out and new[0] is state[0] and new[1] is state[1]
    assert check("y", out, want_y, 1e-5) is None
    assert check("h_r", state[0], want_s[0], 1e-5) is None
    assert check("h_i", state[1], want_s[1], 1e-5) is None


def test_outputs_that_alias_inputs_are_refused():
    layer = _layer()
    x, state = _token(2, 6)
    fresh = tuple(torch.empty(2, 6) for _ in range(2))
    with torch.no_grad():
        with pytest.raises(ValueError, match="out overlaps x"):
            layer.step(x, state, out=x)
        with pytest.raises(ValueError, match="state_out\\[0\\] overlaps state\\[1\\]"):
            layer.step(x, state, state_out=(state[1], fresh[1]))
        with pytest.raises(ValueError, match="state_out\\[0\\] overlaps state_out\\[1\\]"):
            layer.step(x, state, state_out=(fresh[0], fresh[0]))
        with pytest.raises(ValueError, match="out must be a contiguous torch.float32"):
            layer.step(x, state, out=torch.empty(2, 12, dtype=torch.float64))
        with pytest.raises(ValueError, match="state_out\\[0\\] must be"):
            layer.step(x, state, state_out=(torch.empty(2, 5), fresh[1]))


def test_the_generation_loop_checks_its_buffers_once_and_every_new_x():
    # the in-place loop's buffers are checked on the first step, then only a new x against
    # them: an x that is (part of) out or the state is still refused, a changed buffer is
    # checked in full again
    layer = _layer()
    x, state = _token(2, 6)
    out = torch.empty_like(x)
    with torch.no_grad():
        layer.step(x, state, out=out, state_out=state)
        layer.step(x.clone(), state, out=out, state_out=state)       # the remembered path
        with pytest.raises(ValueError, match="out overlaps x"):
            layer.step(out, state, out=out, state_out=state)
        both = torch.empty(2 * 2 * 6 + 2 * 12)
        h_r = both[:12].view(2, 6)
        layer.step(x, (h_r, state[1]), out=out, state_out=(h_r, state[1]))
        with pytest.raises(ValueError, match="overlaps x"):
            layer.step(both[:24].view(2, 12), (h_r, state[1]), out=out,
                       state_out=(h_r, state[1]))
        out.resize_(2, 10)
        with pytest.raises(ValueError, match="out must be a contiguous"):
            layer.step(x, state, out=out, state_out=state)


def test_changing_the_strategy_takes_effect():
    layer = _layer()
    x, state = _token(2, 6)
    with torch.no_grad():
        layer.step(x, state)
        layer.decode_strategy = "nope"
        with pytest.raises(ValueError, match="unknown decode strategy"):
            layer.step(x, state)
        layer.decode_strategy = ("blocked", {"block_m": 16, "block_d": 64})
    _assert_step_is_reference(layer, x, state)


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


class _Stub:
    """Stands in for the kernel: counts launches (the interpreter runs torch ops itself)."""

    launches = 0

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            _Stub.launches += 1
        return launch


def test_cached_in_place_step_runs_no_torch_op(monkeypatch):
    """A step after the first: cheap checks and one launch, no allocation, cast or copy."""
    layer = _layer(M=40)
    x, state = _token(3, 40)
    out = torch.empty_like(x)
    monkeypatch.setattr(kernels, "samu_decode_step", _Stub())
    with torch.no_grad():
        layer.step(x, state, out=out, state_out=state)
        launches = _Stub.launches
        with _Ops() as mode:
            layer.step(x, state, out=out, state_out=state)
        with _Ops() as fresh:
            layer.step(x, state)
    assert _Stub.launches == launches + 2
    assert mode.ops == []
    assert len(fresh.ops) == 3, fresh.ops  # y and the two state halves


def test_inference_tensors_are_not_cached():
    """Parameters made under inference_mode have no version counter: digest every step."""
    with torch.inference_mode():
        layer = _layer()
        x, state = _token(2, 6)
        layer.step(x, state)
        y, _ = layer.step(x, state)
    assert layer._decoder.constants.builds == 2
    want, _ = step_reference(x.double(), SAMUParams(*(p.double() for p in layer.params())),
                             tuple(s.double() for s in state))
    assert check("y", y, want, 1e-5) is None


@pytest.mark.gpu
def test_in_place_step_replays_in_a_cuda_graph():
    """Captured once with static buffers, replayed per token: equal to forward on the tokens."""
    B, L, M = 4, 5, 96
    layer = _layer(M).cuda()
    g = torch.Generator().manual_seed(2)
    xs = torch.randn(B, L, 2 * M, generator=g).cuda()
    state0 = tuple(torch.randn(B, M, generator=g).cuda() for _ in range(2))
    x_t, out = torch.empty(B, 2 * M, device="cuda"), torch.empty(B, 2 * M, device="cuda")
    state = tuple(s.clone() for s in state0)
    with torch.no_grad():
        y_fwd, final = layer(xs, state0)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # compile and fill the caches outside the capture
            layer.step(x_t, state, out=out, state_out=state)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            layer.step(x_t, state, out=out, state_out=state)
        for s, s0 in zip(state, state0):
            s.copy_(s0)
        ys = []
        for t in range(L):
            x_t.copy_(xs[:, t])
            graph.replay()
            ys.append(out.clone())
    tol = TOLERANCES["float32"].forward
    assert check("y", torch.stack(ys, dim=1), y_fwd, tol) is None
    assert check("final_r", state[0], final[0], 1e-5) is None
    assert check("final_i", state[1], final[1], 1e-5) is None
