"""The ``lookback`` strategy beyond the registry-generated checks.

Many chunks (so a look-back crosses several predecessors), ragged L and a ragged last mode
tile, resets on and inside chunk boundaries, an initial state, gradients through the final
state only, half precision, chained vs decoupled agreement, the loop-inner variant (rows
walked one at a time instead of a tile scan), the config space and workspace.

Under the interpreter programs run one after the other, so a predecessor is always complete
and its inclusive prefix published; a ``window`` > 1 in decoupled mode (a plan knob: only
every W-th chunk publishes its prefix) makes the look-back compose predecessor aggregates
instead.  Chained mode with a window composes aggregates by design.  A ``lookback_width`` >
1 reads that many predecessors per poll: with a window, aggregates and inclusive prefixes lie
inside one poll's predecessors; a probe kernel drives ``_look_back`` on hand-set statuses
(unpublished chunks older than the prefix, payloads the walk must not read poisoned).
GPU-marked: a race stress test (thousands of chunks, many repeats) and one compiled binary
for every shape.
"""
import pytest
import torch
import triton
import triton.language as tl

from samu_tune import registry
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.reference import scan_reference
from samu_tune.kernels import lookback as lookback_kernels
from samu_tune.ops.layer.fused_autograd import fused_layer
from samu_tune.ops.scan.strategies import lookback as lb
from samu_tune.ops.scan.strategies import lookback_config as lbc
from samu_tune.ops.scan.strategies.lookback import LookbackConfig, LookbackPlan
from samu_tune.ops.scan.verify import random_inputs, verify

from _helpers import assert_reset_at_t0_cuts_h0_off, binaries_over_shapes, cpu_problem as _problem

SMALL = LookbackConfig(chunk=16, block_m=16, num_warps=2, lookback="decoupled")
CHAINED = SMALL.model_copy(update={"lookback": "chained"})
# loop-inner: the chunk's 16 rows walked one at a time on [16] vectors
LOOP = SMALL.model_copy(update={"inner": "loop"})
LOOP_CHAINED = CHAINED.model_copy(update={"inner": "loop"})
# two rows per walk step (an odd last row walked after the loop)
LOOP_ROWS2 = LOOP.model_copy(update={"rows": 2})
# wide look-back: 8 / 16 predecessors per poll
WIDE = SMALL.model_copy(update={"lookback_width": 8})
WIDER = SMALL.model_copy(update={"lookback_width": 16})
LOOP_WIDE = LOOP.model_copy(update={"lookback_width": 8})


def _run(plan):
    return lambda inp: lb.lookback_scan(inp, plan)


def _check(plan, problem, inputs=None, seed=0, reset_rate=0.15):
    inputs = inputs if inputs is not None else random_inputs(problem, seed=seed,
                                                             reset_rate=reset_rate)
    failure = verify(_run(plan), inputs, problem, seed=seed)
    assert failure is None, f"{plan}: {failure}"


def _grads(fn, inputs, weights=(1.0, 3.0, 1.0, -2.0)):
    """Forward outputs and every gradient of a fixed loss, as a flat list."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs.differentiable()]
    eta, delta, nu_log, theta_log, br, bi, *h0 = leaves
    out = fn(inputs.replace(eta=eta, delta=delta, nu_log=nu_log, theta_log=theta_log, br=br,
                            bi=bi, initial_state=tuple(h0) or None))
    wr, wi, wfr, wfi = weights
    loss = wr * out.real.double().sum() + wi * out.imag.double().sum()
    if out.final_state is not None:
        loss = loss + wfr * out.final_state[0].sum() + wfi * out.final_state[1].sum()
    loss.backward()
    return [out.real, out.imag, *(out.final_state or ())] + [leaf.grad for leaf in leaves]


def _resets_at(L, cuts):
    """segment_pos [2, L] int32: row 0 resets at each t in ``cuts``, row 1 at t = 0 only."""
    seg = torch.arange(L, dtype=torch.int32).repeat(2, 1) + 5
    for t in cuts:
        seg[0, t:] = torch.arange(L - t, dtype=torch.int32)
    seg[1, 0:] = torch.arange(L, dtype=torch.int32)
    return seg


def _check_with_resets(plan, L, cuts, seed):
    """``plan`` on B = 2, M = 37 (3 mode tiles, the last ragged) fp32 with resets at ``cuts``
    (row 0) and t = 0 (row 1), initial and final state (:func:`_check`)."""
    problem = _problem(2, L, 37, dtype="float32", resets=True, initial_state=True,
                       final_state=True)
    inputs = random_inputs(problem, seed=seed)
    _check(plan, problem, inputs=inputs.replace(segment_pos=_resets_at(L, cuts)), seed=seed)


@pytest.mark.parametrize("plan", [
    LookbackPlan.of(SMALL),
    LookbackPlan.of(CHAINED),
    LookbackPlan.of(SMALL, window=3),
    LookbackPlan.of(LookbackConfig(chunk=32, block_m=32, num_warps=4), window=100),
    LookbackPlan.of(CHAINED, window=2),
], ids=["decoupled", "chained", "aggregates-every-3", "aggregates-to-chunk0",
        "chained-window-2"])
def test_many_chunks_ragged_L_and_mode_tiles(plan):
    # L = 70: 5 chunks of 16 (3 of 32), the last ragged; M = 37: 3 tiles of 16 (2 of 32);
    # sparse resets so chunk aggregates are not all zero maps
    problem = _problem(2, 70, 37, dtype="float32", resets=True, initial_state=True,
                       final_state=True)
    _check(plan, problem, seed=1, reset_rate=0.02)


@pytest.mark.parametrize("plan", [
    LookbackPlan.of(SMALL.model_copy(update={"sub": 4})),
    LookbackPlan.of(SMALL.model_copy(update={"sub": 4}), window=2),
    LookbackPlan.of(CHAINED.model_copy(update={"sub": 4})),
], ids=["sub4", "sub4-aggregates-every-2", "sub4-chained"])
def test_sub_tiles_per_chunk(plan):
    # chunk = 4 tiles of 16 = 64 steps; L = 150: 3 chunks, the last with 1.4 tiles (ragged,
    # two padding tiles); resets land inside tiles, on tile and on chunk boundaries
    _check_with_resets(plan, 150, (16, 64, 70, 129), seed=6)
    # without resets: h0 reaches every chunk, gradients flow through 9 tiles
    problem = _problem(1, 150, 5, dtype="float32", initial_state=True, final_state=True)
    _check(plan, problem, seed=7)


@pytest.mark.parametrize("plan", [
    LookbackPlan.of(LOOP),
    LookbackPlan.of(LOOP, window=3),
    LookbackPlan.of(LOOP_CHAINED),
    LookbackPlan.of(LOOP_CHAINED, window=2),
    LookbackPlan.of(LOOP.model_copy(update={"sub": 2}), window=2),
    LookbackPlan.of(LOOP_ROWS2),
    LookbackPlan.of(LOOP_ROWS2, window=3),
    LookbackPlan.of(LOOP_CHAINED.model_copy(update={"rows": 2})),
    LookbackPlan.of(LOOP.model_copy(update={"stages": 3})),
    LookbackPlan.of(LOOP_ROWS2.model_copy(update={"stages": 4}), window=3),
], ids=["loop", "loop-aggregates-every-3", "loop-chained", "loop-chained-window-2",
        "loop-sub2-aggregates-every-2", "loop-rows2", "loop-rows2-aggregates-every-3",
        "loop-rows2-chained", "loop-staged-3", "loop-rows2-staged-4-aggregates-every-3"])
def test_loop_inner(plan):
    # as test_many_chunks_ragged_L_and_mode_tiles, rows walked: L = 70 (5 chunks of 16, 3 of
    # 32 with sub 2, the last ragged: 6 rows, and L = 45, 37 below: an odd last chunk for
    # rows 2), M = 37 (3 mode tiles, the last ragged); resets inside chunks, on chunk
    # boundaries and at t = 0 (row 1), initial and final state
    _check_with_resets(plan, 70, (16, 20, 48, 69), seed=8)
    # without resets h0 reaches every chunk; bf16 data
    problem = _problem(1, 45, 20, dtype="bfloat16", initial_state=True, final_state=True)
    _check(plan, problem, seed=9)
    # M a multiple of 8 (the M_ALIGN = 8 binary: vectorised rows), the last mode tile ragged
    assert lb.m_align(plan, 40) == 8 and lb.m_align(plan, 20) == 1
    problem = _problem(2, 37, 40, dtype="bfloat16", resets=True, initial_state=True,
                       final_state=True)
    _check(plan, problem, seed=10)


@pytest.mark.parametrize("rebase", [True, False], ids=["rebased", "by-token"])
@pytest.mark.parametrize("loop_cfg", [LOOP, LOOP_ROWS2], ids=["rows1", "rows2"])
def test_loop_walks_from_rebased_pointers_or_by_token(loop_cfg, rebase, monkeypatch):
    # both addressings of the loop walks (LookbackPlan.rebase picks one per direction),
    # forced in both directions: resets, h0, final state, ragged L and mode tiles, M_ALIGN 8
    monkeypatch.setattr(LookbackPlan, "rebase", lambda self, reverse: rebase)
    plan = LookbackPlan.of(loop_cfg)
    _check_with_resets(plan, 45, (16, 31, 44), seed=21)
    problem = _problem(2, 37, 40, dtype="bfloat16", resets=True, initial_state=True,
                       final_state=True)
    _check(plan, problem, seed=22)


def test_rebase_rule():
    # by token only backward at two rows and more than 2 lanes per thread (registers)
    four_lanes = LookbackPlan.of(LookbackConfig(chunk=64, block_m=256, num_warps=2,
                                                inner="loop", rows=2))
    two_lanes = LookbackPlan.of(LookbackConfig(chunk=32, block_m=256, num_warps=4,
                                               inner="loop", rows=2))
    one_row = LookbackPlan.of(LookbackConfig(chunk=64, block_m=512, num_warps=4, inner="loop"))
    assert four_lanes.rebase(False) and not four_lanes.rebase(True)
    assert two_lanes.rebase(False) and two_lanes.rebase(True)
    assert one_row.rebase(False) and one_row.rebase(True)


@pytest.mark.parametrize("loop_cfg", [LOOP, LOOP_ROWS2], ids=["rows1", "rows2"])
def test_loop_inner_gradient_through_the_final_state_only_and_tiles_agree(loop_cfg):
    # L = 41: the last chunk has 9 rows (odd: rows 2 walks its last row after the loop)
    problem = _problem(2, 41, 6, dtype="float32", resets=True, initial_state=True,
                       final_state=True)
    inputs = random_inputs(problem, seed=4, reset_rate=0.05)
    tile = _grads(_run(LookbackPlan.of(SMALL, window=2)), inputs, weights=(0.0, 0.0, 1.0, -2.0))
    loop = _grads(_run(LookbackPlan.of(loop_cfg, window=2)), inputs,
                  weights=(0.0, 0.0, 1.0, -2.0))
    for a, b in zip(tile, loop):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5)
    assert any(float(g.abs().max()) > 0 for g in loop[4:])


def test_loop_inner_config_space():
    strat = registry.get("lookback")
    big = strat.configs(_problem(8, 8192, 1024))
    loops = [c for c in big if c.inner == "loop" and c.lookback_width == 1 and c.stages == 1]
    assert 10 <= len(loops) <= 26, len(loops)
    # software-pipelined walks: 64+-step chunks at 2-4 lanes per thread, within the staged
    # shared-memory budget; never for the tile scan
    staged = [c for c in big if c.stages > 1]
    assert staged and all(c.inner == "loop" and c.chunk >= lbc._STAGED_MIN_CHUNK
                          and lb.lanes_per_thread(c) <= lbc._STAGED_MAX_LANES
                          and lbc.staged_bytes(_problem(8, 8192, 1024), c)
                          <= lbc._MAX_STAGED_BYTES for c in staged)
    assert {c.stages for c in staged} == {4, 6}
    assert not any(c.stages > 1 for c in strat.configs(_problem(8, 8192, 32)))
    assert all(c.sub == 1 and c.lookback == "decoupled" and c.window == 1 for c in loops)
    two = [c for c in loops if c.rows == 2]
    assert two and all(c.block_m // (32 * c.num_warps) in lbc._LOOP_ROWS2_LANES
                       and c.chunk <= lbc._LOOP_ROWS2_MAX_CHUNK for c in two)
    assert all(c.rows == 1 for c in big if c.inner == "tile")
    # a wide look-back only where a thread's window payload fits (2 lanes per thread at 8),
    # and never with two rows per step
    wide = [c for c in big if c.inner == "loop" and c.lookback_width > 1]
    assert wide and all(c.lookback_width == 8 and c.block_m == 64 * c.num_warps
                        and c.rows == 1 for c in wide)
    assert {c.chunk for c in loops} == set(lbc._LOOP_CHUNKS)
    assert all(c.block_m // (32 * c.num_warps) in lbc._LOOP_LANES_PER_THREAD for c in loops)
    tiles = [c for c in big if c.inner == "tile"]
    assert max(c.block_m for c in tiles) == 128            # wide vectors only for the loop
    det = strat.configs(_problem(8, 8192, 1024, deterministic=True))
    assert {c.lookback for c in det if c.inner == "loop"} == {"chained"}
    small = strat.configs(_problem(2, 300, 40))            # no 128-lane vector fits M = 40
    assert not [c for c in small if c.inner == "loop"]
    assert not lb.valid(_problem(8, 8192, 1024), LookbackConfig(
        chunk=64, block_m=512, num_warps=4, inner="loop", sub=4))


@pytest.mark.parametrize("every", [1, 4])
def test_long_look_back_without_resets(every):
    # 10 chunks (149 = 9 * 16 + 5): with every = 4 chunk 7 composes 3 aggregates
    problem = _problem(1, 149, 8, dtype="float32", initial_state=True, final_state=True)
    _check(LookbackPlan.of(SMALL, window=every), problem, seed=2)


def test_resets_on_and_inside_chunk_boundaries():
    problem = _problem(2, 53, 5, dtype="float32", resets=True, initial_state=True,
                       final_state=True)
    inputs = random_inputs(problem, seed=3)
    seg = torch.arange(53, dtype=torch.int32).repeat(2, 1) + 3
    for t in (0, 16, 31, 32, 40, 52):        # row 0: at t = 0, on boundaries, inside, last
        seg[0, t:] = torch.arange(53 - t, dtype=torch.int32)
    for t in (15, 17, 48):                   # row 1: next to boundaries, none at t = 0
        seg[1, t:] = torch.arange(53 - t, dtype=torch.int32)
    inputs = inputs.replace(segment_pos=seg)
    for plan in (LookbackPlan.of(SMALL), LookbackPlan.of(SMALL, window=2),
                 LookbackPlan.of(CHAINED), LookbackPlan.of(CHAINED, window=3)):
        _check(plan, problem, inputs=inputs, seed=3)
    # a reset at t = 0 cuts h0 off: zero gradient for row 0 only
    assert_reset_at_t0_cuts_h0_off(_run(LookbackPlan.of(SMALL)), inputs)


@pytest.mark.parametrize("cfg", [SMALL, WIDE], ids=["width1", "width8"])
def test_gradient_through_the_final_state_only(cfg):
    problem = _problem(2, 40, 6, dtype="float32", initial_state=True, final_state=True)
    inputs = random_inputs(problem, seed=4)
    plan = LookbackPlan.of(cfg, window=2)
    got = _grads(_run(plan), inputs, weights=(0.0, 0.0, 1.0, -2.0))

    def ref(inp):
        return scan_reference(inp.eta, inp.delta, inp.nu_log, inp.theta_log, inp.br, inp.bi,
                              initial_state=inp.initial_state, output_final_state=True)
    want = _grads(ref, inputs.replace(**{
        k: getattr(inputs, k).double() for k in ("eta", "delta", "nu_log", "theta_log", "br",
                                                 "bi")}, initial_state=tuple(
        h.double() for h in inputs.initial_state)), weights=(0.0, 0.0, 1.0, -2.0))
    for g, w in zip(got[4:], want[4:]):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cfg", [SMALL, LOOP, LOOP_CHAINED], ids=["tile", "loop", "chained"])
def test_a_second_backward_of_the_graph_gets_fresh_zeroed_buffers(cfg):
    """The forward zeroes the backward's statuses and (decoupled) its atomic gradient sums:
    a second backward (retain_graph) must not reuse them as written by the first."""
    problem = _problem(2, 40, 20, dtype="float32", resets=True, initial_state=True,
                       final_state=True)
    inputs = random_inputs(problem, seed=8, reset_rate=0.1)
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs.differentiable()]
    eta, delta, nu_log, theta_log, br, bi, h0r, h0i = leaves
    out = lb.run(inputs.replace(eta=eta, delta=delta, nu_log=nu_log, theta_log=theta_log,
                                br=br, bi=bi, initial_state=(h0r, h0i)), cfg)
    loss = (out.real * 1.5 - out.imag).sum() + out.final_state[1].sum()
    first = torch.autograd.grad(loss, leaves, retain_graph=True)
    second = torch.autograd.grad(loss, leaves)
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # and both are right: the float64 reference's gradients
    ref_leaves = [t.detach().double().requires_grad_(True) for t in leaves]
    r_eta, r_delta, r_nu, r_theta, r_br, r_bi, r_h0r, r_h0i = ref_leaves
    want_out = scan_reference(r_eta, r_delta, r_nu, r_theta, r_br, r_bi,
                              initial_state=(r_h0r, r_h0i), segment_pos=inputs.segment_pos,
                              output_final_state=True)
    want = torch.autograd.grad((want_out.real * 1.5 - want_out.imag).sum()
                               + want_out.final_state[1].sum(), ref_leaves)
    for a, w in zip(second, want):
        torch.testing.assert_close(a.double(), w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype,control", [("bfloat16", "float32"), ("float16", "bfloat16"),
                                           ("bfloat16", "bfloat16")])
def test_half_precision(dtype, control):
    problem = _problem(2, 45, 20, dtype=dtype, control_dtype=control, resets=True,
                       initial_state=True, final_state=True)
    inputs = random_inputs(problem, seed=5, reset_rate=0.05)
    out = lb.run(inputs, SMALL)
    assert out.real.dtype == inputs.br.dtype and out.final_state[0].dtype == torch.float32
    _check(LookbackPlan.of(SMALL, window=2), problem, inputs=inputs, seed=5)


def test_forward_only_and_tiny_shapes():
    for B, L, M in ((1, 1, 1), (3, 17, 1), (1, 16, 16)):
        problem = _problem(B, L, M, dtype="float32", final_state=True, backward=False)
        inputs = random_inputs(problem, seed=L)
        with torch.no_grad():
            out = lb.run(inputs, lb.default(problem))
        want = scan_reference(inputs.eta, inputs.delta, inputs.nu_log, inputs.theta_log,
                              inputs.br, inputs.bi, output_final_state=True)
        torch.testing.assert_close(out.real, want.real, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(out.final_state[1], want.final_state[1], rtol=1e-4, atol=1e-5)
        assert not out.real.requires_grad


def test_chained_and_decoupled_agree_and_chained_is_reproducible():
    problem = _problem(2, 75, 20, dtype="float32", resets=True, initial_state=True,
                       final_state=True)
    inputs = random_inputs(problem, seed=6, reset_rate=0.03)
    chained = _grads(_run(LookbackPlan.of(CHAINED)), inputs)
    for plan in (LookbackPlan.of(SMALL, window=3), LookbackPlan.of(CHAINED, window=2)):
        for c, d in zip(chained, _grads(_run(plan), inputs)):
            torch.testing.assert_close(c, d, rtol=2e-5, atol=2e-5)
    for a, b in zip(chained, _grads(_run(LookbackPlan.of(CHAINED)), inputs)):
        assert torch.equal(a, b)


def test_a_window_below_one_is_refused():
    problem = _problem(1, 20, 4, dtype="float32", backward=False)
    with pytest.raises(ValueError, match="window"):
        lb.lookback_scan(random_inputs(problem), LookbackPlan.of(SMALL, window=0))


def test_config_space_is_pruned_and_default_is_valid():
    strat = registry.get("lookback")
    for M in (1, 5, 20, 100, 1000):
        for L in (1, 3, 100, 5000):
            for det in (False, True):
                problem = _problem(2, L, M, deterministic=det)
                configs = strat.configs(problem)
                assert configs, (L, M, det)
                assert strat.default_config(problem) in configs
                for cfg in configs:
                    # tile budget (a loop's registers hold one row: its own space, tested below)
                    assert cfg.inner == "loop" or (
                        32 * cfg.num_warps <= cfg.chunk * cfg.block_m
                        <= lbc._MAX_PER_THREAD * 32 * cfg.num_warps)
                    assert not (det and cfg.lookback == "decoupled")
                    assert cfg.window == 1 or (cfg.lookback == "chained"
                                               and cfg.window < -(-L // (cfg.chunk * cfg.sub)))
                    # a wide look-back: decoupled, and walks longer than a narrower width's
                    assert cfg.lookback_width == 1 or (
                        cfg.lookback == "decoupled"
                        and -(-L // (cfg.chunk * cfg.sub)) > {8: 2, 16: 9}[cfg.lookback_width])
    big = strat.configs(_problem(8, 8192, 1024))
    assert {c.chunk for c in big} == {16, 32, 64, 128, 256}
    assert {c.block_m for c in big if c.inner == "tile"} == {16, 32, 64, 128}
    assert {c.lookback for c in big} == {"decoupled", "chained"}
    assert LookbackConfig(chunk=256, block_m=64) not in big          # over the tile budget
    assert {c.chunk for c in strat.configs(_problem(1, 20, 8))} == {16, 32}
    assert {c.window for c in big} == {1, 8, 32}
    assert {c.lookback_width for c in big} == {1, 8, 16}
    assert not lb.valid(_problem(1, 32, 8), SMALL.model_copy(update={"lookback_width": 8}))
    assert not lb.valid(_problem(8, 8192, 1024), LookbackConfig(    # 4 lanes x 8: spills
        chunk=32, block_m=512, num_warps=4, inner="loop", lookback_width=8))
    # the staged 64-step loop walk of 256 modes, two rows per step (one for aligned training
    # above M = 512 and from 256 chunks on: (4, 16384, 256), not (2, 16320, 256)); of 128
    # modes: the same, or, narrow (B M <= 512 over 256+ chunks, from M = 96), one row with a
    # look-back width of 8 (the tile scan below M = 128 otherwise); 128 modes where their
    # tiles cover fewer (300, 384); unstaged where M % 8 != 0
    defaults = [lb.default(_problem(B, L, M, backward=bwd))
                for B, L, M, bwd in ((1, 16384, 256, True), (4, 4096, 512, True),
                                     (3, 5000, 300, True), (8, 8192, 1024, True),
                                     (8, 8192, 1024, False), (2, 65536, 128, True),
                                     (4, 65472, 200, True), (4, 128, 200, True),
                                     (2, 4096, 384, True), (12, 3000, 700, True),
                                     (1, 2048, 1000, True), (1, 2048, 1000, False),
                                     (2, 20000, 96, True), (4, 16384, 256, True),
                                     (2, 16320, 256, True))]
    assert [(c.block_m, c.rows, c.lookback_width, c.stages) for c in defaults] == [
        (128, 1, 8, 6), (256, 2, 1, 6), (128, 2, 1, 1), (256, 1, 1, 6), (512, 2, 1, 4),
        (128, 1, 8, 6), (128, 1, 1, 6), (128, 2, 1, 6), (128, 2, 1, 6), (256, 2, 1, 1),
        (256, 1, 1, 6), (256, 2, 1, 6), (128, 1, 8, 6), (256, 1, 1, 6), (256, 2, 1, 6)]
    # a forward of many rows of wide modes: 512 modes at 4 warps, two rows, 4 stages
    wide = [lb.default(_problem(B, L, M, backward=False))
            for B, L, M in ((16, 2048, 512), (8, 8192, 1024), (4, 4096, 512), (16, 2048, 500))]
    assert [(c.block_m, c.num_warps, c.rows, c.stages) for c in wide] == [
        (512, 4, 2, 4), (512, 4, 2, 4), (256, 2, 2, 6), (256, 4, 2, 1)]
    assert lb.default(_problem(16, 2048, 512)).block_m == 256        # training: not this
    # the unstaged forward (M % 8 != 0) walks 32-step chunks at 2 lanes per thread, training
    # 64-step chunks at 2 warps
    assert [(c.chunk, c.block_m, c.num_warps) for c in (
        lb.default(_problem(B, L, M, backward=bwd))
        for B, L, M, bwd in ((3, 5000, 300, False), (12, 3000, 700, False),
                             (16, 2048, 500, False), (3, 5000, 300, True),
                             (12, 3000, 700, True)))] == [
        (32, 128, 2), (32, 256, 4), (32, 256, 4), (64, 128, 2), (64, 256, 2)]
    assert lb.default(_problem(8, 20000, 96)).inner == "tile"     # B M = 768 > 512
    assert lb.default(_problem(1, 20000, 64)).inner == "tile"     # M < 96: not narrow
    narrow_det = lb.default(_problem(2, 20000, 96, deterministic=True))
    assert narrow_det.inner == "tile" and narrow_det.lookback == "chained"
    det = lb.default(_problem(2, 65536, 128, deterministic=True))
    assert (det.rows, det.lookback_width, det.lookback) == (2, 1, "chained")
    assert lb.default(_problem(1, 20, 8, deterministic=True)).lookback == "chained"
    assert lb.default(_problem(1, 20, 8, deterministic=True)).window == 1
    assert lb.default(_problem(1, 5000, 8, deterministic=True)).window == 8
    assert strat.priority == 11 and strat.capability.deterministic


def test_workspace_counts_sync_buffers_and_gradient_buffers():
    problem = ScanProblem(B=2, L=100, M=40, backward=True)
    cfg = LookbackConfig(chunk=32, block_m=32)
    slots = 2 * 2 * 4                     # B * mode tiles * chunks
    head = 4 * 20                         # ticket + statuses, padded to 16 bytes
    sync = head + 4 * slots * 6 * 32
    forward = problem.model_copy(update={"backward": False})
    assert lb.workspace_bytes(forward, cfg) == sync
    # decoupled training: the backward's head, final-state gradient, atomic accumulators
    assert lb.workspace_bytes(problem, cfg) == sync + head + 4 * (2 * 2 * 40 + 2 * 200 + 2 * 40)
    # chained: per-program partials instead
    chained = cfg.model_copy(update={"lookback": "chained"})
    assert lb.workspace_bytes(problem, chained) == sync + head + 4 * (
        2 * 2 * 40 + 2 * 2 * 100 * 2 + 2 * 2 * 4 * 40)
    # loop-inner: plus the control table, 16 bytes a token
    loop = LookbackConfig(chunk=32, block_m=64, num_warps=2, inner="loop")
    loop_slots = 2 * 1 * 4
    assert lb.workspace_bytes(forward, loop) == 4 * 12 + 4 * loop_slots * 6 * 64 + 16 * 200


@pytest.mark.parametrize("plan", [
    LookbackPlan.of(WIDE),
    LookbackPlan.of(WIDE, window=3),
    LookbackPlan.of(WIDE, window=100),
    LookbackPlan.of(WIDER, window=5),
    LookbackPlan.of(LOOP_WIDE, window=3),
    LookbackPlan.of(WIDE.model_copy(update={"sub": 2}), window=2),
], ids=["width8", "width8-prefix-every-3", "width8-aggregates-to-chunk0",
        "width16-prefix-every-5", "loop-width8-prefix-every-3", "width8-sub2-prefix-every-2"])
def test_wide_look_back(plan):
    # L = 170: 11 chunks of 16 (6 of 32 with sub 2), the last ragged; M = 37: 3 mode tiles,
    # the last ragged.  Every chunk publishes its prefix (a poll stops at the newest), or
    # every 3rd / 5th (aggregates and an inclusive prefix inside one poll), or only chunk 0
    # (whole polls of aggregates, then the window moves 8 chunks back).  Resets inside chunks,
    # on chunk boundaries and at t = 0 (row 1); initial and final state
    _check_with_resets(plan, 170, (16, 37, 96, 150), seed=12)
    # without resets h0 reaches every chunk; bf16 data, odd M
    problem = _problem(1, 150, 5, dtype="bfloat16", initial_state=True, final_state=True)
    _check(plan, problem, seed=13)


@triton.jit
def _look_back_probe(sync_ptr, carry_ptr, io_ptr, slot, c, status0, BLOCK_M: tl.constexpr,
                     WIDTH: tl.constexpr):
    """io [4, BLOCK_M]: init (r, i) in, the state entering chunk ``c`` (r, i) out."""
    lane = tl.arange(0, BLOCK_M)
    carry_r, carry_i = lookback_kernels._look_back(
        sync_ptr, carry_ptr, slot, c, lane, tl.load(io_ptr + lane),
        tl.load(io_ptr + BLOCK_M + lane), status0, BLOCK_M, WIDTH)
    tl.store(io_ptr + 2 * BLOCK_M + lane, carry_r)
    tl.store(io_ptr + 3 * BLOCK_M + lane, carry_i)


def _probe_walk(statuses, c, width, seed=0, status0=0):
    """Run ``_look_back`` for chunk c of the second of two (row, mode tile) groups whose
    chunks have ``statuses``; returns (got, want) complex [BLOCK_M] (want: float64 walk).
    ``status0`` > 0: the head as a reused one holds it, each status word ``status0`` + the
    status, an unpublished one what earlier launches left (``status0`` - 1 or - 2, or 0)."""
    n, block_m = len(statuses), 4
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(seed)
    nan = float("nan")
    carry = torch.randn(2 * n, 6, block_m, generator=g, dtype=torch.float64)
    sync = torch.zeros(1 + 2 * n, dtype=torch.int32)
    sync[1:1 + n] = status0 + 2          # the first group: never read (NaN payloads)
    carry[:n] = nan
    for k, s in enumerate(statuses):
        stale = (status0 - 1, status0 - 2, 0)[k % 3]    # what earlier launches left
        sync[1 + n + k] = status0 + s if s or not status0 else stale
        if s != 1:
            carry[n + k, :4] = nan       # an aggregate the walk must not compose
        if s != 2:
            carry[n + k, 4:] = nan       # a prefix the walk must not read
    init = torch.randn(2, block_m, generator=g, dtype=torch.float64)
    io = torch.cat([init, torch.zeros(2, block_m, dtype=torch.float64)]).float()
    sync_d, carry_d, io_d = sync.to(device), carry.float().to(device), io.to(device)
    _look_back_probe[(1,)](sync_d, carry_d, io_d, n + c, c, status0, BLOCK_M=block_m,
                           WIDTH=width)
    got = torch.complex(io_d[2].double().cpu(), io_d[3].double().cpu())
    # the walk one predecessor at a time, in float64
    pq = carry[n:].float().double()
    ea, eb = torch.ones(block_m, dtype=torch.complex128), torch.zeros(block_m,
                                                                      dtype=torch.complex128)
    state = torch.complex(init[0].float().double(), init[1].float().double())
    for j in range(c - 1, -1, -1):
        if statuses[j] == 2:
            return got, ea * torch.complex(pq[j, 4], pq[j, 5]) + eb
        assert statuses[j] == 1
        p, q = torch.complex(pq[j, 0], pq[j, 1]), torch.complex(pq[j, 2], pq[j, 3])
        ea, eb = ea * p, ea * q + eb
    return got, state


@pytest.mark.parametrize("status0", [0, 3 * 77])
@pytest.mark.parametrize("width", [1, 8, 16])
def test_look_back_window_on_set_statuses(width, status0):
    n = 30
    cases = [
        ([2] + [1] * (n - 1), 29),                     # aggregates back to chunk 0
        ([2] + [1] * (n - 1), 9),
        ([2] + [0] * 20 + [2, 1, 1, 1, 1, 1, 1, 1, 1], 30),   # unpublished beyond the prefix
        ([2] + [0] * 12 + [2] + [1] * 16, 30),         # the prefix two or three polls back
        ([2, 1, 2, 1, 1, 2, 0, 1, 2, 2, 1, 1, 1] + [0] * 17, 13),   # mixed, newest first
        ([2] * n, 29),                                 # the newest is a prefix
        ([2] + [1] * 7 + [2] + [1] * 8 + [0] * 13, 17),  # a prefix exactly one poll back
        ([2] * n, 1),
        ([2] * n, 0),                                  # chunk 0: init, no walk
    ]
    for k, (statuses, c) in enumerate(cases):
        got, want = _probe_walk(statuses, c, width, seed=k, status0=status0)
        assert torch.isfinite(got).all(), (k, got)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"case {k}")


# ---- GPU -----------------------------------------------------------------------------------

def _cuda_inputs(problem, seed, reset_rate=0.002):
    return random_inputs(problem, seed=seed, device="cuda", reset_rate=reset_rate)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [
    LookbackConfig(chunk=128, block_m=32, num_warps=4),       # the shipped defaults first
    LookbackConfig(chunk=16, block_m=128, num_warps=2),
    LookbackConfig(chunk=16, block_m=16, num_warps=2, lookback="decoupled"),
    LookbackConfig(chunk=64, block_m=32, num_warps=4, lookback="decoupled"),
    LookbackConfig(chunk=128, block_m=64, num_warps=8, lookback="decoupled"),
    LookbackConfig(chunk=32, block_m=16, num_warps=2, lookback="chained"),
    LookbackConfig(chunk=64, block_m=32, num_warps=4, lookback="chained", window=8),
    LookbackConfig(chunk=32, block_m=32, num_warps=4, sub=4),
    LookbackConfig(chunk=16, block_m=16, num_warps=2, lookback="chained", window=8, sub=4),
    LookbackConfig(chunk=32, block_m=64, num_warps=2, inner="loop"),
    LookbackConfig(chunk=64, block_m=64, num_warps=2, lookback="chained", window=8,
                   inner="loop"),
    LookbackConfig(chunk=32, block_m=256, num_warps=2, inner="loop", rows=2),
    LookbackConfig(chunk=128, block_m=32, num_warps=4, lookback_width=8),
    LookbackConfig(chunk=16, block_m=16, num_warps=2, lookback_width=16),
    LookbackConfig(chunk=32, block_m=32, num_warps=4, lookback_width=16, sub=4),
    LookbackConfig(chunk=32, block_m=64, num_warps=2, inner="loop", lookback_width=8),
    LookbackConfig(chunk=32, block_m=256, num_warps=4, inner="loop", lookback_width=8),
    LookbackConfig(chunk=64, block_m=256, num_warps=2, inner="loop", rows=2, stages=4),
    LookbackConfig(chunk=64, block_m=128, num_warps=2, inner="loop", stages=6),
], ids=lambda c: f"{c.lookback}{c.window}-c{c.chunk}x{c.sub}-m{c.block_m}-w{c.num_warps}"
                 f"-{c.inner}-r{c.rows}-lw{c.lookback_width}-p{c.stages}")
def test_gpu_race_stress(cfg):
    """Thousands of chunks, repeated: every run close to serial (forward and backward), chained
    runs bitwise identical.  A lost or reordered publication reads an unwritten payload
    (torch.empty) or a wrong carry: a large error in the chunk's rows, caught by the max-norm
    check; rounding differences of the tree order are not (elementwise checks would trip on
    cancellations in the control gradients, hence the norms)."""
    from samu_tune.tolerances import relative_error
    problem = ScanProblem(B=2, L=50_000, M=48, dtype="float32", device="cuda", resets=True,
                          initial_state=True, final_state=True)
    inputs = _cuda_inputs(problem, seed=11)
    serial = registry.get("serial")
    want = _grads(lambda inp: serial.run(inp, serial.default(problem)), inputs)
    first = None
    for rep in range(12):
        got = _grads(lambda inp: lb.run(inp, cfg), inputs)
        for i, (g, w) in enumerate(zip(got, want)):
            g, w = g.double(), w.double()
            worst = float((g - w).abs().max() / w.abs().max().clamp_min(1e-30))
            scale = 1.0 if i < 4 else 10.0          # outputs and final state, then gradients
            assert relative_error(g, w) <= 1e-4 * scale and worst <= 1e-3 * scale, (rep, i, worst)
        if cfg.lookback == "chained":
            if first is None:
                first = got
            else:
                assert all(torch.equal(a, b) for a, b in zip(first, got)), f"rep {rep}"
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 16384, 256), (2, 65536, 128), (8, 8192, 1024)])
def test_gpu_benchmark_shapes_match_serial(shape):
    """The default config at the benchmark shapes (bf16) against the serial strategy (the
    float64 reference walks L in Python: too slow here), in relative norm."""
    from samu_tune.tolerances import TOLERANCES, relative_error
    B, L, M = shape
    problem = ScanProblem(B=B, L=L, M=M, dtype="bfloat16", device="cuda", resets=True,
                          initial_state=True, final_state=True)
    inputs = _cuda_inputs(problem, seed=B, reset_rate=0.01)
    serial = registry.get("serial")
    want = _grads(lambda inp: serial.run(inp, serial.default(problem)), inputs)
    got = _grads(lambda inp: lb.run(inp, lb.default(problem)), inputs)
    tol = TOLERANCES["bfloat16"]
    for i, (g, w) in enumerate(zip(got, want)):
        limit = tol.forward if i < 4 else tol.gradient
        assert relative_error(g, w) <= limit, (i, relative_error(g, w))


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [LookbackConfig(chunk=16, block_m=16, num_warps=2),
                                 LookbackConfig(chunk=64, block_m=32, num_warps=4,
                                                lookback="chained"),
                                 LookbackConfig(chunk=64, block_m=128, num_warps=2,
                                                inner="loop")],
                         ids=["decoupled", "chained", "loop"])
def test_a_new_shape_does_not_recompile(cfg):
    from samu_tune.kernels import lookback as lookback_kernels
    from samu_tune.settings import settings
    if settings().interpret:
        pytest.skip("counts compiled binaries: needs TRITON_INTERPRET=0")
    shapes = [(2, 37, 20), (3, 64, 48), (1, 1, 1), (4, 129, 97), (2, 50, 64)]
    counts = [c[0] for c in binaries_over_shapes(lambda inp: lb.run(inp, cfg),
                                                 [lookback_kernels.lookback_scan], shapes)]
    # counts are the kernel's binaries in this process (earlier tests' included)
    assert counts[0] >= 2, counts         # forward and reverse
    # the loop path: at most one more pair for M a multiple of 8 (M_ALIGN, vectorised rows;
    # none when an earlier test compiled it), then no more
    assert counts[1] - counts[0] in ((0, 2) if cfg.inner == "loop" else (0,)), counts
    assert all(c == counts[1] for c in counts[2:]), counts


def test_fused_layer_rows2_matches_rows1():
    # the fused SAMU layer kernels (write x * gamma in, relu(cat(Re h, Im h)) out, backward's
    # relu mask and d gamma) with two rows per walk step against one (checked against the
    # float64 layer in tests/test_layer.py): L = 37 (last chunk 5 rows, odd), M = 20 (two
    # mode tiles, the last ragged), resets, h0, every gradient
    B, L, M = 2, 37, 20
    g = torch.Generator().manual_seed(11)
    x = torch.randn(B, L, 2 * M, generator=g)
    gamma = torch.rand(M, generator=g) + 0.5
    dirs = torch.randn(2, 2 * M + 1, generator=g)
    dirs = dirs / dirs.norm(dim=1, keepdim=True)       # the controller's unit directions
    scales = torch.tensor([0.7, -0.5]) / M ** 0.5       # tanh(amplitudes) / sqrt(M)
    nu_log, theta_log = 0.5 * torch.randn(M, generator=g), torch.randn(M, generator=g)
    h0 = (torch.randn(B, M, generator=g), torch.randn(B, M, generator=g))
    seg = torch.arange(L, dtype=torch.int32).repeat(B, 1) + 3
    seg[0, 20:] = torch.arange(L - 20, dtype=torch.int32)
    up = torch.randn(B, L, 2 * M, generator=g)

    def run(cfg):
        leaves = [t.clone().requires_grad_(True)
                  for t in (x, dirs, scales, gamma, nu_log, theta_log, *h0)]
        y, (fr, fi) = fused_layer(*leaves[:6], cfg, seg=seg, h0=tuple(leaves[6:]))
        ((y * up).sum() + fr.sum() - 2 * fi.sum()).backward()
        return [y, fr, fi] + [t.grad for t in leaves]

    one, two = run(LOOP), run(LOOP_ROWS2)
    for a, b in zip(one, two):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert all(float(t.detach().abs().max()) > 0 for t in one)


def test_fused_layer_refuses_bad_inputs():
    # the kernels index gamma, nu_log, theta_log, h0 and seg by B, L, M unchecked
    B, L, M = 2, 5, 4
    x = torch.randn(B, L, 2 * M)
    dirs, scales = torch.randn(2, 2 * M + 1), torch.randn(2)
    params = [torch.ones(M), torch.zeros(M), torch.zeros(M)]           # gamma, nu_log, theta_log
    assert fused_layer(x, dirs, scales, *params, LOOP)[0].shape == (B, L, 2 * M)
    with pytest.raises(ValueError, match="loop-inner"):
        fused_layer(x, dirs, scales, *params, SMALL)
    with pytest.raises(ValueError, match="loop-inner"):
        fused_layer(x, dirs, scales, *params, LOOP.model_dump())
    with pytest.raises(ValueError, match=r"\[B, L, 2M\]"):
        fused_layer(x.reshape(B * L, 2 * M), dirs, scales, *params, LOOP)
    for k, bad in ((0, torch.ones(M + 1)), (1, torch.zeros(M, dtype=torch.float64)),
                   (2, torch.zeros(2, M))):
        wrong = params[:k] + [bad] + params[k + 1:]
        with pytest.raises(ValueError, match=("gamma", "nu_log", "theta_log")[k]):
            fused_layer(x, dirs, scales, *wrong, LOOP)
    with pytest.raises(ValueError, match=r"h0\[0\]"):
        fused_layer(x, dirs, scales, *params, LOOP, h0=(torch.zeros(B, M - 1),
                                                           torch.zeros(B, M)))
    with pytest.raises(ValueError, match="seg"):
        fused_layer(x, dirs, scales, *params, LOOP, seg=torch.zeros(L, B, dtype=torch.int32))
    with pytest.raises(ValueError, match="dirs"):
        fused_layer(x, dirs[:, :-1].contiguous(), scales, *params, LOOP)


@pytest.mark.parametrize("takes", [False, True])
def test_a_plans_backward_launch_replaces_the_walk_or_declines(takes):
    """A plan's ``backward`` launch gets the backward's buffers once per backward: when it
    declines (False) the Triton walk runs; when it takes the launch (here: the walk itself,
    through the arguments it is given) the walk does not run again.  Gradients match the
    float64 reference either way."""
    cfg = LookbackConfig(chunk=16, block_m=16, num_warps=2, inner="loop")
    problem = _problem(2, 40, 24, dtype="float32", backward=True, resets=True,
                       initial_state=True, final_state=True)
    calls = []

    def launch(plan, B, L, M, *, nu_log, theta_log, ctl, x, h0, y, end, gx, gh0, g_ctl,
               g_spec, sync, kept):
        calls.append((B, L, M))
        if takes:
            lb._launch(plan, True, B, L, M, eta=None, delta=None, nu_log=nu_log,
                       theta_log=theta_log, seg=None, x=x, h0=h0, y=y, end=end, gx=gx,
                       gh0=gh0, p_ctl=g_ctl, p_spec=g_spec, ctl=ctl, sync=sync, kept=kept)
        return takes

    walks = []
    real = lb._launch

    def counting(plan, reverse, *args, **kwargs):
        walks.append(reverse)
        return real(plan, reverse, *args, **kwargs)

    plan = LookbackPlan.of(cfg, backward=launch)
    inputs = random_inputs(problem, seed=3)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lb, "_launch", counting)
        failure = verify(lambda inp: lb.lookback_scan(inp, plan), inputs, problem, seed=3)
    assert failure is None, failure
    assert calls == [(2, 40, 24)]
    assert walks.count(True) == 1          # the backward walk ran once: by the hook or after it
