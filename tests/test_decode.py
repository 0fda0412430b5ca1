"""Decode kernels (single, blocked) against the torch reference of one SAMU step."""
import pytest
import torch

import samu_tune
from samu_tune.ops.layer import SAMUParams, step_reference
from samu_tune.ops.decode import step as decode
from samu_tune.tolerances import TOLERANCES, check


def _params(M, seed=0):
    g = torch.Generator().manual_seed(seed)
    layer = samu_tune.SAMU(M, generator=g, phase_amplitude_init=0.8, radial_amplitude_init=-1.1)
    return SAMUParams(*(p.detach() for p in layer.params()))


DECODE_CASES = [
    (3, 5, torch.float32, True, None),      # odd M, one tile
    (2, 40, torch.float32, True, 16),       # several mode tiles
    (1, 1, torch.float32, False, None),     # M = 1, no state
    (2, 37, torch.bfloat16, True, 16),
    (2, 9, torch.float16, False, None),
]


@pytest.mark.parametrize("name", ["single", "blocked"])
@pytest.mark.parametrize("B,M,dtype,has_state,block_m", DECODE_CASES)
def test_decode_kernel_matches_reference(name, B, M, dtype, has_state, block_m):
    _compare(name, B, M, dtype, has_state, block_m, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["single", "blocked", "auto"])
@pytest.mark.parametrize("B,M,dtype,has_state,block_m", DECODE_CASES + [
    (64, 1024, torch.bfloat16, True, None), (1, 777, torch.float32, True, None)])
def test_decode_kernel_matches_reference_cuda(name, B, M, dtype, has_state, block_m):
    _compare(name, B, M, dtype, has_state, block_m, "cuda")


def _compare(name, B, M, dtype, has_state, block_m, device):
    params = _params(M)
    g = torch.Generator().manual_seed(B * 100 + M)
    x = torch.randn(B, 2 * M, generator=g).to(dtype)
    state = tuple(torch.randn(B, M, generator=g) for _ in range(2)) if has_state else None
    strategy = name if block_m is None else (name, {"block_m": block_m, "block_d": 64})
    dev_params = SAMUParams(*(p.to(device) for p in params))
    dev_state = None if state is None else tuple(s.to(device) for s in state)
    y, (hr, hi) = decode.decode_step(x.to(device), dev_params, dev_state, strategy=strategy)
    y_ref, (rr, ri) = step_reference(x.double(), params.to(torch.float64),
                                     None if state is None else tuple(s.double() for s in state))
    assert y.dtype == dtype and y.shape == (B, 2 * M)
    assert hr.dtype == torch.float32 and hr.shape == (B, M)
    tol = TOLERANCES[str(dtype).removeprefix("torch.")].forward
    for what, got, want in (("y", y, y_ref), ("h_r", hr, rr), ("h_i", hi, ri)):
        reason = check(what, got, want, tol)
        assert reason is None, reason


def test_width_spans_several_controller_tiles():
    """2M + 1 > BLOCK_D: the controller dot products loop over width tiles."""
    M = 70
    params = _params(M, seed=3)
    x = torch.randn(2, 2 * M)
    state = (torch.randn(2, M), torch.randn(2, M))
    y, s = decode.decode_step(x, params, state, strategy=("blocked", {"block_m": 32,
                                                                     "block_d": 64}))
    y_ref, s_ref = step_reference(x, params, state)
    assert check("y", y, y_ref, 1e-5) is None
    assert check("h_r", s[0], s_ref[0], 1e-5) is None


def test_auto_choice_by_batch_size_and_grad():
    params = _params(200)
    x_small = torch.randn(2, 400)
    x_big = torch.randn(64, 400)
    assert decode.choose(x_small, params) == "blocked"
    assert decode.choose(x_big, params) == "blocked"     # M = 200: four mode tiles
    assert decode.choose(torch.randn(64, 96), _params(48)) == "single"    # one tile
    assert decode.choose(x_small.double(), params) == "reference"
    assert decode.choose(x_small.requires_grad_(), params) == "reference"
    with pytest.raises(ValueError, match="no backward"):
        decode.decode_step(x_small, params, strategy="single")
    with pytest.raises(ValueError, match="unknown decode strategy"):
        decode.decode_step(x_big, params, strategy="nope")
    with pytest.raises(ValueError, match="state\\[0\\]"):
        decode.decode_step(x_big, params, (torch.zeros(1, 200), torch.zeros(1, 200)))


def test_kernels_not_used_on_plain_cpu(monkeypatch):
    from samu_tune import settings as settings_mod
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    settings_mod.reload_settings()
    try:
        params = _params(4)
        assert decode.choose(torch.randn(2, 8), params) == "reference"
        with pytest.raises(ValueError, match="TRITON_INTERPRET"):
            decode.decode_step(torch.randn(2, 8), params, strategy="blocked")
    finally:
        monkeypatch.undo()
        settings_mod.reload_settings()
