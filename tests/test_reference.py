"""The reference against an independent complex128 loop, and gradcheck on tiny inputs."""
import cmath
import math

import pytest
import torch

from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.reference import scan_reference
from samu_tune.ops.scan.verify import random_inputs


def naive(inputs):
    """Literal transcription of DESIGN.md §1 with Python complex numbers."""
    B, L, M = inputs.shape
    out = torch.zeros(B, L, M, dtype=torch.complex128)
    final = torch.zeros(B, M, dtype=torch.complex128)
    for b in range(B):
        for m in range(M):
            nu = math.exp(float(inputs.nu_log[m]))
            theta = math.exp(float(inputs.theta_log[m]))
            h = 0j
            if inputs.initial_state is not None:
                h = complex(float(inputs.initial_state[0][b, m]), float(inputs.initial_state[1][b, m]))
            for t in range(L):
                a = math.exp(-nu * math.exp(float(inputs.eta[b, t]))) * cmath.exp(
                    1j * (theta + float(inputs.delta[b, t])))
                if inputs.segment_pos is not None and int(inputs.segment_pos[b, t]) == 0:
                    a = 0j
                h = a * h + complex(float(inputs.br[b, t, m]), float(inputs.bi[b, t, m]))
                out[b, t, m] = h
            final[b, m] = h
    return out, final


@pytest.mark.parametrize("resets,h0", [(False, False), (True, False), (False, True), (True, True)])
def test_reference_matches_naive_loop(resets, h0):
    p = ScanProblem(B=2, L=11, M=3, dtype="float64", control_dtype="float64", device="cpu",
                    resets=resets, initial_state=h0, final_state=True)
    inp = random_inputs(p, seed=3)
    if resets:
        assert bool((inp.segment_pos == 0).any())
    out = scan_reference(inp.eta, inp.delta, inp.nu_log, inp.theta_log, inp.br, inp.bi,
                         initial_state=inp.initial_state, segment_pos=inp.segment_pos,
                         output_final_state=True)
    want, final = naive(inp)
    torch.testing.assert_close(out.real, want.real, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.imag, want.imag, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.final_state[0], final.real, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.final_state[1], final.imag, rtol=1e-12, atol=1e-12)


def test_reset_at_start_ignores_h0():
    p = ScanProblem(B=1, L=4, M=2, dtype="float64", control_dtype="float64", device="cpu",
                    resets=True, initial_state=True)
    inp = random_inputs(p, seed=5)
    seg = torch.tensor([[0, 1, 2, 0]], dtype=torch.int32)
    h0 = tuple(h.clone().requires_grad_(True) for h in inp.initial_state)
    out = scan_reference(inp.eta, inp.delta, inp.nu_log, inp.theta_log, inp.br, inp.bi,
                         initial_state=h0, segment_pos=seg)
    torch.testing.assert_close(out.real[:, 0], inp.br[:, 0])
    (out.real.sum() + out.imag.sum()).backward()
    assert float(h0[0].grad.abs().max()) == 0.0 and float(h0[1].grad.abs().max()) == 0.0


@pytest.mark.parametrize("resets", [False, True])
def test_reference_gradcheck(resets):
    p = ScanProblem(B=2, L=5, M=3, dtype="float64", control_dtype="float64", device="cpu",
                    resets=resets, initial_state=True, final_state=True)
    inp = random_inputs(p, seed=11)
    leaves = [t.clone().requires_grad_(True) for t in inp.differentiable()]

    def f(eta, delta, nu_log, theta_log, br, bi, h0r, h0i):
        out = scan_reference(eta, delta, nu_log, theta_log, br, bi, initial_state=(h0r, h0i),
                             segment_pos=inp.segment_pos, output_final_state=True)
        return out.real, out.imag, out.final_state[0], out.final_state[1]

    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-7)


def test_reference_dtypes():
    p = ScanProblem(B=1, L=6, M=4, dtype="bfloat16", device="cpu", final_state=True)
    inp = random_inputs(p, seed=1)
    out = scan_reference(inp.eta, inp.delta, inp.nu_log, inp.theta_log, inp.br, inp.bi,
                         output_final_state=True)
    assert out.real.dtype == torch.bfloat16 and out.final_state[0].dtype == torch.float32
