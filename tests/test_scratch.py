"""Kept scratch buffers (:mod:`samu_tune.scratch`): reused per role and stream, grown when too
small, never while poisoned; a no-grad scan that drops its final state writes it there, and
the results stay right across calls of different shapes."""
import pytest
import torch

import samu_tune
from samu_tune import scratch, settings
from samu_tune.ops.scan.reference import scan_reference
from samu_tune.ops.scan.verify import random_inputs

from _helpers import cpu_problem

LOOKBACK = ("lookback", None)


@pytest.fixture
def unpoisoned(monkeypatch):
    monkeypatch.setenv("SAMU_TUNE_POISON", "0")
    settings.reload_settings()
    scratch.clear()
    yield
    scratch.clear()
    monkeypatch.undo()
    settings.reload_settings()


def test_a_buffer_is_kept_per_role_and_grown(unpoisoned):
    cpu = torch.device("cpu")
    a = scratch.fp32("carry", 100, cpu)
    assert a.dtype == torch.float32 and a.numel() >= 100
    assert scratch.fp32("carry", 50, cpu) is a           # smaller: the same buffer
    assert scratch.fp32("table", 50, cpu) is not a       # another role: its own
    b = scratch.fp32("carry", 1000, cpu)
    assert b is not a and b.numel() >= 1000
    assert scratch.fp32("carry", 100, cpu) is b
    scratch.clear()
    assert scratch.fp32("carry", 100, cpu) is not b


def test_large_buffers_are_not_kept_and_the_count_is_bounded(unpoisoned, monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(scratch, "KEEP_MAX_WORDS", 64)
    monkeypatch.setattr(scratch, "KEEP_MAX_BUFFERS", 3)
    big = scratch.fp32("carry", 65, cpu)
    assert big.numel() >= 65 and scratch.fp32("carry", 65, cpu) is not big and not scratch._KEPT
    for role in ("a", "b", "c", "d"):
        scratch.fp32(role, 8, cpu)
    assert len(scratch._KEPT) <= 3 and ("d", cpu, 0) in scratch._KEPT


def test_the_operators_keep_nothing(unpoisoned):
    """The torch.library operators (torch.compile's path: a CUDA-graph tree's warm-up
    allocates into the graph's pool) allocate their scratch fresh."""
    inputs = random_inputs(cpu_problem(2, 40, 16, dtype="float32", backward=True), seed=5)
    leaves = [t.clone().requires_grad_(True) for t in (inputs.eta, inputs.delta, inputs.nu_log,
                                                         inputs.theta_log, inputs.br, inputs.bi)]
    out_r, out_i, last_r, last_i, aux = torch.ops.samu_tune.scan_fwd(
        *leaves, None, None, None, True, True, "lookback")
    (out_r.sum() + out_i.sum() + last_r.sum()).backward()
    assert not scratch._KEPT
    # the eager path keeps its summaries
    out = samu_tune.scan(*leaves, strategy="lookback")
    (out.real.sum() + out.imag.sum()).backward()
    assert {role for role, *_ in scratch._KEPT} == {"carry"}


def test_poisoned_buffers_are_fresh_nan():
    # the test session runs poisoned (conftest): every call a new NaN-filled buffer
    cpu = torch.device("cpu")
    a, b = scratch.fp32("carry", 16, cpu), scratch.fp32("carry", 16, cpu)
    assert a is not b and torch.isnan(a).all()


def _run(inputs, final):
    with torch.no_grad():
        return samu_tune.scan(inputs.eta, inputs.delta, inputs.nu_log, inputs.theta_log,
                              inputs.br, inputs.bi, output_final_state=final,
                              strategy="lookback")


def _expected(inputs):
    """The float64 reference."""
    wide = [t.double() for t in (inputs.eta, inputs.delta, inputs.nu_log, inputs.theta_log,
                                 inputs.br, inputs.bi)]
    return scan_reference(*wide, output_final_state=True)


@pytest.mark.parametrize("shapes", [[(2, 40, 16), (3, 130, 24), (1, 20, 8)]],
                         ids=["grow-then-shrink"])
def test_no_grad_scans_through_kept_buffers_stay_right(unpoisoned, shapes):
    finals = []
    for i, (B, L, M) in enumerate(shapes):
        inputs = random_inputs(cpu_problem(B, L, M, dtype="float32"), seed=i)
        want = _expected(inputs)
        dropped = _run(inputs, final=False)
        assert dropped.final_state is None
        kept = {role for role, *_ in scratch._KEPT}
        assert {"carry", "last_r", "last_i"} <= kept
        torch.testing.assert_close(dropped.real.double(), want.real, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(dropped.imag.double(), want.imag, atol=1e-4, rtol=1e-4)
        # asked for, the final state is the caller's own tensor, never a kept buffer
        out = _run(inputs, final=True)
        ids = {t.data_ptr() for t in scratch._KEPT.values()}
        assert not {t.data_ptr() for t in out.final_state} & ids
        finals.append((out.final_state, want.final_state))
    # later calls wrote into the kept buffers, not into any returned final state
    for got, want in finals:
        torch.testing.assert_close(got[0].double(), want[0], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got[1].double(), want[1], atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
def test_cuda_kept_buffers_per_stream_and_fresh_under_capture(unpoisoned):
    """On CUDA: a buffer per stream, none kept while a graph is captured, and a captured
    no-grad scan replays right after eager calls of other shapes on the same stream."""
    dev = torch.device("cuda")
    main = scratch.fp32("carry", 64, dev)
    assert scratch.fp32("carry", 64, dev) is main
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert scratch.fp32("carry", 64, dev) is not main
    problem = cpu_problem(2, 300, 128, dtype="bfloat16", device="cuda")
    inputs = random_inputs(problem, seed=3)
    want = _expected(inputs)
    got = _run(inputs, final=False)              # warm: compiles, keeps buffers
    torch.testing.assert_close(got.real.double(), want.real, atol=2e-2, rtol=2e-2)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        _run(inputs, final=False)
        stream.synchronize()
        kept_before = dict(scratch._KEPT)
        with torch.cuda.graph(graph, stream=stream):
            captured = _run(inputs, final=False)
        assert scratch._KEPT == kept_before      # nothing kept from inside the capture
    torch.cuda.current_stream().wait_stream(stream)
    for B, L, M in ((4, 700, 256), (1, 64, 96)):  # eager calls through the kept buffers
        other = random_inputs(cpu_problem(B, L, M, dtype="bfloat16", device="cuda"), seed=B)
        _run(other, final=False)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured.real.double(), want.real, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(captured.imag.double(), want.imag, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_reduce_overhead_compiled_scan_beside_eager_kept_buffers(unpoisoned):
    """Eager calls keep buffers while a CUDA-graph tree (torch.compile reduce-overhead) runs the
    operators, which keep none: the tree's pool checks pass and both agree with eager."""
    problem = cpu_problem(2, 300, 128, dtype="bfloat16", device="cuda", backward=True)
    inputs = random_inputs(problem, seed=4)
    args = [t.clone().requires_grad_(True) for t in (inputs.eta, inputs.delta, inputs.nu_log,
                                                      inputs.theta_log, inputs.br, inputs.bi)]

    def step(*a):
        out = samu_tune.scan(*a, strategy="lookback")
        return out.real.float().square().sum() + out.imag.float().square().sum()

    compiled = torch.compile(step, mode="reduce-overhead")
    want = step(*args)
    want_grads = torch.autograd.grad(want, args)
    for _ in range(3):
        _run(inputs, final=False)                    # eager, through kept buffers
        loss = compiled(*args)
        grads = torch.autograd.grad(loss, args)
        torch.testing.assert_close(loss, want, rtol=1e-3, atol=1e-3)
        for g, w in zip(grads, want_grads):
            torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2)
    assert {role for role, *_ in scratch._KEPT} >= {"carry", "last_r", "last_i"}
