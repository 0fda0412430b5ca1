"""Kept scratch buffers (:mod:`samu_tune.scratch`): reused per role and stream, grown when too
small, never while poisoned; a no-grad scan that drops its final state writes it there, and
the results stay right across calls of different shapes."""
import pytest
import torch
import triton
import triton.language as tl

import samu_tune
from samu_tune import scratch, settings
from samu_tune.autograd import OpContext
from samu_tune.kernels import lookback as lookback_kernels
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
    """The float64 reference (with the inputs' initial state and resets, if any)."""
    wide = [t.double() for t in (inputs.eta, inputs.delta, inputs.nu_log, inputs.theta_log,
                                 inputs.br, inputs.bi)]
    h0 = inputs.initial_state
    return scan_reference(*wide, initial_state=None if h0 is None else tuple(
        t.double() for t in h0), segment_pos=inputs.segment_pos, output_final_state=True)


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
        heads_before = {k: (h.tickets, h.launches) for k, h in scratch._HEADS.items()}
        with torch.cuda.graph(graph, stream=stream):
            captured = _run(inputs, final=False)
        assert scratch._KEPT == kept_before      # nothing kept from inside the capture
        # the captured launch zeroes its own head: a replay never meets a kept head's counts
        assert {k: (h.tickets, h.launches) for k, h in scratch._HEADS.items()} == heads_before
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


# ---- the look-back head kept without a zero fill --------------------------------------------

def _plan(**update):
    from samu_tune.ops.scan.strategies.lookback import LookbackConfig, LookbackPlan
    base = LookbackConfig(chunk=16, block_m=16, num_warps=2, lookback="decoupled")
    return LookbackPlan.of(base.model_copy(update=update))


def _no_grad_scan(plan, inputs):
    from samu_tune.ops.scan.strategies import lookback as lb
    with torch.no_grad():
        return lb.lookback_scan(inputs, plan)


def _int32_fills(monkeypatch):
    """Counts the int32 zero fills (``torch.zeros``) made while the test runs."""
    fills = []
    zeros = torch.zeros

    def counting(*args, **kwargs):
        if kwargs.get("dtype") is torch.int32:
            fills.append(args)
        return zeros(*args, **kwargs)

    monkeypatch.setattr(torch, "zeros", counting)
    return fills


# (B, L, M, resets, initial state): 9, 3 and 1 chunks of 16, ragged L and M, 1-3 mode tiles
HEAD_SHAPES = [(2, 130, 37, True, True), (1, 40, 16, False, False), (3, 16, 20, True, False),
               (2, 130, 37, False, True), (1, 97, 8, True, True)]


@pytest.mark.parametrize("limit", [None, 60], ids=["kept", "re-zeroed-at-the-limit"])
@pytest.mark.parametrize("update", [{}, {"inner": "loop"}, {"lookback_width": 8}],
                         ids=["tile", "loop", "width8"])
def test_no_grad_scans_reuse_the_head_without_a_fill(unpoisoned, monkeypatch, limit, update):
    """No-grad eager look-back scans take the head kept for the stream: a zero fill when it is
    made or grown and (a small limit) before a counter would pass the limit, none per call;
    each launch starts where the tickets of the ones before it end and raises the status
    base by 3.  Every result matches the float64 reference: a status an earlier launch left
    read as published would compose that launch's summaries (or stall)."""
    if limit:
        monkeypatch.setattr(scratch, "HEAD_LIMIT", limit)
    plan = _plan(**update)
    fills = _int32_fills(monkeypatch)
    tickets = launches = 0
    for i, (B, L, M, resets, h0) in enumerate(HEAD_SHAPES * 2):
        problem = cpu_problem(B, L, M, dtype="float32", resets=resets, initial_state=h0,
                              final_state=True)
        inputs = random_inputs(problem, seed=i)
        out = _no_grad_scan(plan, inputs)
        want = _expected(inputs)
        for got, exp in ((out.real, want.real), (out.imag, want.imag),
                         (out.final_state[0], want.final_state[0]),
                         (out.final_state[1], want.final_state[1])):
            torch.testing.assert_close(got.double(), exp, atol=1e-4, rtol=1e-4,
                                       msg=f"call {i} {(B, L, M)}")
        slots = B * -(-M // 16) * -(-L // 16)
        (head,) = scratch._HEADS.values()
        if limit and (tickets + slots > limit or 3 * launches + 2 > limit):
            tickets = launches = 0
        tickets, launches = tickets + slots, launches + 1
        assert (head.tickets, head.launches) == (tickets, launches)
        assert int(head.buf[0]) == tickets             # every program took one ticket
    assert len(fills) == 1                             # made once (64 words: every shape's)
    buf = head.buf
    if limit:
        assert launches < 2 * len(HEAD_SHAPES)         # the limit re-zeroed the head
        return
    # a launch of more programs than the head holds grows it: zeroed once more
    inputs = random_inputs(cpu_problem(4, 200, 20, dtype="float32", final_state=True), seed=9)
    out = _no_grad_scan(plan, inputs)
    want = _expected(inputs)
    torch.testing.assert_close(out.real.double(), want.real, atol=1e-4, rtol=1e-4)
    (grown,) = scratch._HEADS.values()
    assert grown.buf is not buf and grown.buf.numel() == 128 and len(fills) == 2
    assert (grown.tickets, grown.launches) == (4 * 2 * 13, 1)


def test_a_launch_that_raises_leaves_the_head_counts(unpoisoned, monkeypatch):
    """A launch that raises before it runs takes no tickets: the head's counts stay where
    they were (they advance when a launch returns), its lock is released, and the next
    no-grad scans on it are right."""
    from samu_tune.ops.scan.strategies import lookback as lb
    plan = _plan()
    inputs = random_inputs(cpu_problem(2, 100, 20, dtype="float32", final_state=True), seed=3)
    want = _no_grad_scan(plan, inputs)
    (head,) = scratch._HEADS.values()
    counts = (head.tickets, head.launches)
    fast = type(lb._scan_kernel)
    real_launch = fast.launch

    def failing(self, grid, args, kwargs):
        if self is lb._scan_kernel:
            raise RuntimeError("out of resources")
        return real_launch(self, grid, args, kwargs)

    monkeypatch.setattr(fast, "launch", failing)
    with pytest.raises(RuntimeError, match="out of resources"):
        _no_grad_scan(plan, inputs)
    assert (head.tickets, head.launches) == counts and not head.lock.locked()
    monkeypatch.setattr(fast, "launch", real_launch)
    for _ in range(2):
        got = _no_grad_scan(plan, inputs)
        torch.testing.assert_close(got.real, want.real)
        torch.testing.assert_close(got.final_state[1], want.final_state[1])
    assert scratch._HEADS[next(iter(scratch._HEADS))] is head and head.launches == 3


def test_a_held_head_sends_other_launches_to_fresh_heads(unpoisoned):
    """While one launch holds the stream's head (from taking its counts until its kernel is
    enqueued), another launch on that stream -- another thread's -- gets a fresh zeroed
    head: launches on one head are enqueued in the order of their counts.  The counts
    advance once per launch that returned."""
    cpu = torch.device("cpu")
    with scratch.Head(None, 8, 5, cpu, True) as (kept, t0, s0):
        assert (t0, s0) == (0, 0)
        with scratch.Head(None, 8, 3, cpu, True) as (other, t1, s1):
            assert other is not kept and (t1, s1) == (0, 0) and not other.any()
        with scratch.Head(None, 8, 3, cpu, False) as (unkept, _, _):
            assert unkept is not kept
    with scratch.Head(None, 8, 4, cpu, True) as (again, t2, s2):
        assert again is kept and (t2, s2) == (5, 3)
    given = torch.zeros(8, dtype=torch.int32)
    with scratch.Head(given, 0, 4, cpu, True) as (buf, t3, s3):
        assert buf is given and (t3, s3) == (0, 0)
    (head,) = scratch._HEADS.values()
    assert (head.tickets, head.launches) == (9, 2) and not head.lock.locked()


@triton.jit
def _status_probe(w_ptr, out_ptr, status0, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, lookback_kernels._status(tl.load(w_ptr + i), status0))


def test_a_head_word_of_an_earlier_launch_reads_unpublished():
    """The kernel's status of a head word: the word less status0, an earlier launch's word
    (below status0 + 1) 0."""
    probe = _status_probe
    s0 = 3 * 41
    words = torch.tensor([0, 1, 2, s0 - 2, s0 - 1, s0, s0 + 1, s0 + 2], dtype=torch.int32)
    out = torch.empty_like(words)
    probe[(1,)](words, out, s0, N=8)
    assert out.tolist() == [0, 0, 0, 0, 0, 0, 1, 2]
    probe[(1,)](words[:3].repeat(3)[:8].contiguous(), out, 0, N=8)
    assert out.tolist() == [0, 1, 2, 0, 1, 2, 0, 1]


def test_the_head_is_fresh_when_training_poisoned_or_in_an_operator(unpoisoned, monkeypatch):
    """A training forward zeroes its own head (its backward's rides on it), an operator's
    call too (a CUDA-graph tree's warm-up must not keep buffers), and so does every call
    while buffers are poisoned."""
    problem = cpu_problem(2, 40, 16, dtype="float32", backward=True)
    inputs = random_inputs(problem, seed=1)
    leaves = [t.clone().requires_grad_(True) for t in (inputs.eta, inputs.delta,
                                                         inputs.nu_log, inputs.theta_log,
                                                         inputs.br, inputs.bi)]
    out = samu_tune.scan(*leaves, strategy="lookback")
    (out.real.sum() + out.imag.sum()).backward()
    torch.ops.samu_tune.scan_fwd(*[t.detach() for t in leaves], None, None, None, True, True,
                                 "lookback")
    assert not scratch._HEADS
    with torch.no_grad():
        samu_tune.scan(*leaves, strategy="lookback")
    assert len(scratch._HEADS) == 1
    monkeypatch.setenv("SAMU_TUNE_POISON", "1")
    settings.reload_settings()
    assert scratch._take_head(8, 2, torch.device("cpu")) is None


def test_a_no_grad_fused_layer_reuses_the_head(unpoisoned):
    """The fused SAMU layer's no-grad forward launches on the kept head too, and stays equal
    to its training forward (zeroed heads)."""
    torch.manual_seed(0)
    layer = samu_tune.SAMU(modes=16, strategy="fused")
    x = torch.randn(2, 70, 32)
    with torch.no_grad():
        first, _ = layer(x)
        again, _ = layer(x)
    (head,) = scratch._HEADS.values()
    assert head.launches == 2
    trained, _ = layer(x.clone().requires_grad_(True))
    torch.testing.assert_close(first, trained.detach())
    torch.testing.assert_close(again, first)


@pytest.mark.gpu
@pytest.mark.parametrize("update", [{}, {"inner": "loop", "lookback_width": 8},
                                    {"inner": "loop", "rows": 2, "stages": 4}],
                         ids=["tile", "loop-width8", "loop-rows2-staged"])
def test_cuda_no_grad_scans_on_the_kept_head_under_load(unpoisoned, update):
    """Many chunks in flight on the kept head, launch after launch without a host sync:
    shapes alternate (the largest first: the head is made once, then counts on), and every
    launch matches the same plan on a fresh zeroed head (decoupled look-back composes in
    varying order: a tolerance, not bits)."""
    from samu_tune.ops.scan.strategies import lookback as lb
    plan = _plan(**{"chunk": 64, "block_m": 128, **update})
    shapes = [(1, 65536, 256), (2, 16384, 128), (4, 3000, 300)]
    inputs = [random_inputs(cpu_problem(B, L, M, dtype="bfloat16", device="cuda",
                                        final_state=True), seed=i)
              for i, (B, L, M) in enumerate(shapes)]
    want = []
    for inp in inputs:                     # an operator's forward: a fresh zeroed head
        with torch.no_grad():
            want.append(lb._LookbackScan.forward(OpContext(), plan, None, inp.eta, inp.delta,
                                                 inp.nu_log, inp.theta_log, inp.br, inp.bi,
                                                 None, None))
    assert not scratch._HEADS
    got = []
    for rep in range(12):
        k = rep % len(shapes)
        out = _no_grad_scan(plan, inputs[k])
        got.append((k, out.real.clone(), out.final_state[0].clone()))
    torch.cuda.synchronize()
    (head,) = scratch._HEADS.values()
    assert head.launches == 12        # a head grown (zeroed) later would count from there
    for k, real, last in got:
        torch.testing.assert_close(real.float(), want[k][0].float(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(last, want[k][2], atol=1e-3, rtol=1e-3)
