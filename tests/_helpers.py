"""Checks shared by the strategy-family test files (serial, chunk, lookback, the read-once ones)."""
from __future__ import annotations

import torch

from samu_tune import registry
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.reference import scan_reference
from samu_tune.ops.scan.verify import random_inputs, verify


def cpu_problem(B, L, M, **kw) -> ScanProblem:
    """A ScanProblem on the CPU (the interpreter's device)."""
    kw.setdefault("device", "cpu")
    return ScanProblem(B=B, L=L, M=M, **kw)


def check(name, cfg, problem, inputs=None, seed=0):
    """``cfg`` is valid for ``problem`` and strategy ``name`` under it passes ``verify`` (on
    ``inputs``, or random inputs of ``seed``)."""
    strat = registry.get(name)
    assert strat.valid(problem, cfg), cfg
    inputs = inputs if inputs is not None else random_inputs(problem, seed=seed)
    failure = verify(lambda inp: strat.run(inp, cfg), inputs, problem, seed=seed)
    assert failure is None, f"{name} {cfg!r}: {failure}"


def grads(run, inputs, loss):
    """Every input gradient of ``loss(out)`` for ``run(inputs) -> ScanOutput``, on fresh
    leaves (inputs with an initial state)."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs.differentiable()]
    eta, delta, nu_log, theta_log, br, bi, h0r, h0i = leaves
    out = run(inputs.replace(eta=eta, delta=delta, nu_log=nu_log, theta_log=theta_log, br=br,
                             bi=bi, initial_state=(h0r, h0i)))
    loss(out).backward()
    return [leaf.grad for leaf in leaves]



def bf16_upstream(B, L, M, seed=5):
    """Upstream gradients of a bf16 training step on the GPU: the outputs' pair [B, L, M]
    (bf16) and the final state's [B, M] (fp32)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    up = [torch.randn(B, L, M, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2)]
    return up + [torch.randn(B, M, generator=g, device="cuda") for _ in range(2)]


def outputs_and_grads(strat, cfg, inputs, up):
    """Outputs and final state of ``strat`` at ``cfg`` on fresh leaves of ``inputs`` (with an
    initial state), then every input gradient under the upstream ``up``."""
    leaves = [t.detach().requires_grad_(True) for t in inputs.differentiable()]
    eta, delta, nu_log, theta_log, br, bi = leaves[:6]
    out = strat.run(inputs.replace(eta=eta, delta=delta, nu_log=nu_log, theta_log=theta_log,
                                   br=br, bi=bi, initial_state=tuple(leaves[6:])), cfg)
    outs = (out.real, out.imag, *out.final_state)
    return [*outs, *torch.autograd.grad(outs, leaves, up)]


def assert_training_close(got, want, dtype="bfloat16"):
    """:func:`outputs_and_grads` of two runs within ``dtype``'s tolerances in relative norm
    (the first four: outputs and final state)."""
    from samu_tune.tolerances import TOLERANCES, relative_error
    tol = TOLERANCES[dtype]
    for i, (a, b) in enumerate(zip(got, want)):
        assert relative_error(a, b) <= (tol.forward if i < 4 else tol.gradient), i


def assert_large_training_matches_lookback(strat, shape, launches):
    """Training of ``strat`` at its default config on a bf16 CUDA problem of ``shape`` (B, L,
    M) with resets, h0 and final state: outputs and every gradient against the ``lookback``
    strategy's, in relative norm.  ``launches`` is the caller's record of the kernel under
    test: empty after the ``lookback`` run, one entry after ``strat``'s."""
    B, L, M = shape
    problem = ScanProblem(B=B, L=L, M=M, dtype="bfloat16", device="cuda", backward=True,
                          initial_state=True, final_state=True, resets=True)
    inputs = random_inputs(problem, seed=B, device="cuda", reset_rate=0.001)
    up = bf16_upstream(B, L, M)
    lookback = registry.get("lookback")
    want = outputs_and_grads(lookback, lookback.default(problem), inputs, up)
    assert not launches
    got = outputs_and_grads(strat, strat.default(problem), inputs, up)
    assert len(launches) == 1
    assert_training_close(got, want)


def assert_final_state_grads_match_reference(run, inputs):
    """Gradients through the final state only, against the float64 reference."""

    def final_grads(fn, dtype):
        leaves = [t.detach().to(dtype).requires_grad_(True) for t in inputs.differentiable()]
        eta, delta, nu_log, theta_log, br, bi, h0r, h0i = leaves
        out = fn(eta, delta, nu_log, theta_log, br, bi, (h0r, h0i))
        (out.final_state[0].double().sum() - 2 * out.final_state[1].double().sum()).backward()
        return [leaf.grad for leaf in leaves]

    got = final_grads(lambda *a: run(inputs.replace(
        eta=a[0], delta=a[1], nu_log=a[2], theta_log=a[3], br=a[4], bi=a[5],
        initial_state=a[6])), torch.float32)
    want = final_grads(lambda *a: scan_reference(*a[:6], initial_state=a[6],
                                                 output_final_state=True), torch.float64)
    for g, w in zip(got, want):
        assert g is not None
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-5)


def assert_reset_at_t0_cuts_h0_off(run, inputs):
    """Row 0 of ``inputs`` resets at t = 0 and row 1 does not: h0 gets zero gradient in row 0
    only."""
    h0 = tuple(h.clone().requires_grad_(True) for h in inputs.initial_state)
    out = run(inputs.replace(initial_state=h0))
    (out.real.sum() + out.imag.sum() + out.final_state[0].sum()).backward()
    assert torch.all(h0[0].grad[0] == 0) and torch.all(h0[1].grad[0] == 0)
    assert torch.any(h0[0].grad[1] != 0)


def assert_forward_only_under_no_grad(run, inputs):
    """``run`` under ``torch.no_grad()`` matches the reference's final state and records no
    graph."""
    with torch.no_grad():
        out = run(inputs)
    want = scan_reference(inputs.eta, inputs.delta, inputs.nu_log, inputs.theta_log, inputs.br,
                          inputs.bi, output_final_state=True)
    torch.testing.assert_close(out.final_state[0], want.final_state[0], rtol=1e-4, atol=1e-4)
    assert not out.real.requires_grad


def binaries_over_shapes(run, kernels, shapes, label=""):
    """For each (B, L, M) of ``shapes``: ``run`` passes ``verify`` on a bf16 CUDA problem with
    resets, h0 and final state (seed B); then the compiled binaries of each of ``kernels``.
    Returns one list of counts per shape."""
    counts = []
    for B, L, M in shapes:
        problem = ScanProblem(B=B, L=L, M=M, dtype="bfloat16", device="cuda", resets=True,
                              initial_state=True, final_state=True)
        failure = verify(run, random_inputs(problem, seed=B), problem, seed=B)
        assert failure is None, f"{label}{(B, L, M)}: {failure}"
        torch.cuda.synchronize()
        counts.append([compiled_binaries(k) for k in kernels])
    return counts


def compiled_binaries(fn) -> int:
    """Compiled binaries held by a JITFunction, summed over devices.

    Triton 3.x keeps ``device_caches[device] = (kernel_cache, ...)`` (3.6: 4-tuple, 3.9:
    5-tuple, kernel_cache first either way); older versions ``cache[device] = kernel_cache``.
    """
    caches = getattr(fn, "device_caches", None)
    if caches is not None:
        return sum(len(entry[0]) for entry in caches.values())
    return sum(len(c) for c in fn.cache.values())
