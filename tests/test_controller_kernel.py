"""The controller kernels (:mod:`samu_tune.kernels.controller`): controls and every gradient
against the float64 torch reference, odd 2M and token counts no block divides; the in-place
accumulation into a given grad x; the scan control table written by the controller."""
import pytest
import torch

import samu_tune
from samu_tune.ops.layer import SAMUParams, controller
from samu_tune.ops.layer.reference import controller_reference
from samu_tune.settings import settings
from samu_tune.ops.scan import controls as kernel_controller
from samu_tune.tolerances import TOLERANCES, check

PARAM_NAMES = ("phase_direction", "radial_direction", "phase_amplitude", "radial_amplitude")
F32 = TOLERANCES["float32"]


def _skip_without_kernels(device):
    if device == "cpu" and not settings().interpret:
        pytest.skip("the controller kernels on CPU tensors need TRITON_INTERPRET=1")


def _params(M, device, seed=0):
    layer = samu_tune.SAMU(M, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():  # non-zero bias weights and amplitudes off the init point
        layer.phase_amplitude.fill_(0.7)
        layer.radial_amplitude.fill_(-1.3)
        layer.phase_direction[-1] = 0.4
        layer.radial_direction[-1] = -0.3
    return [p.detach().to(device) for p in layer.params()]


def _x(B, L, M, dtype, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, L, 2 * M, generator=g, dtype=torch.float64) * 1.5).to(dtype).to(device)


def _controls_and_grads(fn, x, params, upstream):
    """(eta, delta) of fn(x, params) and the gradients of x and the controller parameters
    under the loss sum(eta * u_eta + delta * u_delta)."""
    x = x.clone().requires_grad_(True)
    params = [p.clone().requires_grad_(True) for p in params]
    eta, delta = fn(x, SAMUParams(*params))
    u_eta, u_delta = upstream
    loss = (eta.double().cpu() * u_eta).sum() + (delta.double().cpu() * u_delta).sum()
    grads = torch.autograd.grad(loss, [x, *params[:4]])
    return {"eta": eta, "delta": delta, "grad_x": grads[0],
            **{"grad_" + n: g for n, g in zip(PARAM_NAMES, grads[1:])}}


CASES = [  # B, L, M, dtype, device: 2M no tile divides, token counts no block divides
    (2, 37, 67, torch.float32, "cpu"),
    (2, 37, 67, torch.bfloat16, "cpu"),
    (3, 11, 5, torch.float32, "cpu"),
    (1, 45, 5, torch.bfloat16, "cpu"),
    (2, 19, 12, torch.bfloat16, "cpu"),                # 2M a multiple of 8: K_ALIGN 8
    (1, 1, 1, torch.float32, "cpu"),
    pytest.param(2, 37, 67, torch.bfloat16, "cuda", marks=pytest.mark.gpu),
    pytest.param(3, 300, 5, torch.float32, "cuda", marks=pytest.mark.gpu),
]


@pytest.mark.parametrize("programs", [512, 2])    # 2: many token tiles per backward program
@pytest.mark.parametrize("B,L,M,dtype,device", CASES)
def test_controls_and_gradients_match_float64_reference(B, L, M, dtype, device, programs,
                                                        monkeypatch):
    _skip_without_kernels(device)
    monkeypatch.setattr(kernel_controller, "_BWD_PROGRAMS", programs)
    x, params = _x(B, L, M, dtype, device), _params(M, device)
    g = torch.Generator().manual_seed(7)
    upstream = tuple(torch.randn(B, L, generator=g, dtype=torch.float64) for _ in range(2))
    got = _controls_and_grads(controller.kernel_controls, x, params, upstream)
    want = _controls_and_grads(lambda x, p: controller_reference(x, p)[:2], x.double(),
                               [p.double() for p in params], upstream)
    assert got["eta"].dtype == torch.float32 and got["eta"].shape == (B, L)
    assert got["grad_x"].dtype == dtype
    # the controls and parameter gradients are fp32 sums of exact products of x's values:
    # fp32 tolerances whatever x's dtype; grad x is rounded once to x's dtype
    failures = [check(name, got[name], w,
                      TOLERANCES[str(dtype).removeprefix("torch.")].forward
                      if name == "grad_x" else F32.forward if name in ("eta", "delta")
                      else F32.gradient)
                for name, w in want.items()]
    failures = [f for f in failures if f]
    assert not failures, failures
    for name, w in want.items():
        assert float(w.detach().abs().sum()) > 0, name


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("accumulate", [False, True])
def test_operand_gradients_column_by_column(device, accumulate):
    """Gradients of the kernels' own operands (dirs [2, 2M+1], scales [2]) against float64
    autograd: the bias column and each amplitude checked on their own (a wrong one would
    hide in the norm of the rest); with ``accumulate`` grad x is added into a given buffer."""
    _skip_without_kernels(device)
    B, L, M = 2, 41, 67
    K = 2 * M
    x = _x(B, L, M, torch.float32, device)
    dirs, scales = controller.kernel_operands(SAMUParams(*_params(M, device)))
    dirs, scales = dirs.detach(), scales.detach()
    g = torch.Generator().manual_seed(3)
    d_eta, d_delta = (torch.randn(B, L, generator=g).to(device) for _ in range(2))
    c = kernel_controller.forward(x, dirs, scales)
    base = torch.randn(B, L, K, generator=g).to(device) if accumulate else None
    given = None if base is None else base.clone()
    grad_x, g_dirs, g_scales = kernel_controller.backward(
        x, dirs, scales, c.s, d_eta.reshape(-1), d_delta.reshape(-1), given)
    # in place: the fused layer ignores the returned grad x and reads the one it passed
    assert given is None or grad_x.data_ptr() == given.data_ptr()

    x64, d64, s64 = (t.double().requires_grad_(True) for t in (x, dirs, scales))
    q = torch.cat([x64, torch.ones_like(x64[..., :1])], -1) @ d64.T                # [B, L, 2]
    r = torch.tanh(q[..., 1])
    eta, delta = s64[1] * r / (1 + r * r), s64[0] * torch.tanh(q[..., 0])
    loss = (eta * d_eta.double()).sum() + (delta * d_delta.double()).sum()
    w_x, w_dirs, w_scales = torch.autograd.grad(loss, [x64, d64, s64])
    if base is not None:
        w_x = w_x + base.double()
    failures = [f for f in (
        check("eta", c.eta.view(B, L), eta, F32.forward),
        check("delta", c.delta.view(B, L), delta, F32.forward),
        check("grad_x", grad_x, w_x, F32.gradient),
        check("grad_dirs[:, :2M]", g_dirs[:, :K], w_dirs[:, :K], F32.gradient),
        *(check(f"grad_dirs[{i}, 2M] (bias)", g_dirs[i, K], w_dirs[i, K], F32.gradient)
          for i in range(2)),
        *(check(f"grad_scales[{i}]", g_scales[i], w_scales[i], F32.gradient)
          for i in range(2))) if f]
    assert not failures, failures


@pytest.mark.parametrize("resets", [False, True])
def test_forward_writes_the_scans_control_table(resets):
    _skip_without_kernels("cpu")
    B, L, M = 2, 45, 5
    x = _x(B, L, M, torch.bfloat16, "cpu")
    dirs, scales = controller.kernel_operands(SAMUParams(*_params(M, "cpu")))
    seg = None
    if resets:
        seg = (torch.arange(B * L, dtype=torch.int32).reshape(B, L) * 7 % 5)
    c = kernel_controller.forward(x, dirs.detach(), scales.detach(), table=True, seg=seg)
    # the table's contract (samu_tune.kernels.controls): e^eta, cos delta, sin delta, 0 per
    # token; (cos, sin) zero where a reset starts a sequence
    eta, delta = c.eta.view(-1).float(), c.delta.view(-1).float()
    keep = torch.ones_like(eta) if seg is None else (seg.reshape(-1) != 0).float()
    want = torch.stack([eta.exp(), delta.cos() * keep, delta.sin() * keep,
                        torch.zeros_like(eta)], dim=1)
    torch.testing.assert_close(c.table, want, rtol=1e-6, atol=1e-6)
    if resets:
        assert bool((c.table.view(B, L, -1)[..., 1][seg == 0] == 0).all())


def test_operands_of_other_shapes_dtypes_or_layouts_are_refused():
    """The kernels index x, dirs, scales, s, the upstream gradients and a given grad x by T and
    K unchecked: the binding refuses a mismatch with a ValueError naming the operand."""
    x = _x(2, 5, 4, torch.float32, "cpu")                                # K = 8, T = 10
    dirs, scales = torch.randn(2, 9), torch.randn(2)
    c = kernel_controller.forward(x, dirs, scales)
    zeros = torch.zeros(10)
    bad_forward = [
        ((x, torch.randn(2, 8), scales), {}, "dirs"),                    # K columns, not K + 1
        ((x, dirs.double(), scales), {}, "dirs"),
        ((x, dirs, torch.randn(3)), {}, "scales"),
        ((x.double(), dirs, scales), {}, "x must"),
        ((x.transpose(0, 1), dirs, scales), {}, "x must"),
        ((x, dirs, scales), {"table": True, "seg": torch.zeros(9, dtype=torch.int32)}, "seg"),
    ]
    for args, kwargs, match in bad_forward:
        with pytest.raises(ValueError, match=match):
            kernel_controller.forward(*args, **kwargs)
    bad_backward = [
        ((x, dirs, scales, c.s, zeros[:9], zeros), "d_eta"),
        ((x, dirs, scales, c.s, zeros, zeros.double()), "d_delta"),
        ((x, dirs, scales, c.s, zeros, zeros, torch.zeros(2, 5, 8, dtype=torch.bfloat16)),
         "grad_x"),
        ((x, dirs, scales, c.s[:, :9], zeros, zeros), r"s\[0\]"),
    ]
    for args, match in bad_backward:
        with pytest.raises(ValueError, match=match):
            kernel_controller.backward(*args)
