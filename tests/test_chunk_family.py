"""The chunk family (``chunk``, ``hierarchical``, ``grouped``) beyond the registry-generated
checks: several configs, L that no chunk divides, prefixes over several blocks / groups,
resets on and inside chunk boundaries, h0 and final-state-only gradients, odd M over several
mode tiles, B > 1, bf16, atomic reduction, determinism, the config space, workspace, the
prefix kernels on their own, and (GPU) one compiled binary for every shape.
"""
import pytest
import torch
import triton

from samu_tune import registry
from samu_tune.kernels import prefix as prefix_kernels
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.strategies.chunk import ChunkConfig
from samu_tune.ops.scan.strategies.grouped import GroupedConfig
from samu_tune.ops.scan.strategies.hierarchical import HierarchicalConfig
from samu_tune.ops.scan.verify import random_inputs, verify

from _helpers import (assert_final_state_grads_match_reference, assert_forward_only_under_no_grad,
                      assert_reset_at_t0_cuts_h0_off, binaries_over_shapes, check as _check,
                      cpu_problem, grads)

FAMILY = ("chunk", "hierarchical", "grouped")
_MODEL = {"chunk": ChunkConfig, "hierarchical": HierarchicalConfig, "grouped": GroupedConfig}


def _cfg(name, **kw):
    return _MODEL[name](**kw)


def _problem(B, L, M, **kw) -> ScanProblem:
    kw.setdefault("dtype", "float32")
    return cpu_problem(B, L, M, **kw)


@pytest.mark.parametrize("name", FAMILY)
@pytest.mark.parametrize("tile", [dict(chunk=16, block_m=16, num_warps=2),
                                  dict(chunk=32, block_m=16, num_warps=4),
                                  dict(chunk=16, block_m=16, num_warps=2, intra="walk",
                                       num_stages=2)],
                         ids=["c16", "c32", "walk16"])
def test_ragged_length_and_mode_tiles(name, tile):
    # L = 45: a partial last chunk; M = 37: three 16-mode tiles, the last holding 5 modes
    problem = _problem(2, 45, 37, resets=True, initial_state=True, final_state=True)
    _check(name, _cfg(name, **tile), problem, seed=1)


@pytest.mark.parametrize("name", FAMILY)
@pytest.mark.parametrize("intra", ["scan", "walk"])
@pytest.mark.parametrize("shape", [(2, 1, 1), (1, 17, 1)], ids=["L1", "L17"])
def test_one_step_and_a_one_step_last_chunk(name, intra, shape):
    problem = _problem(*shape, resets=True, initial_state=True, final_state=True)
    _check(name, _cfg(name, chunk=16, block_m=16, num_warps=2, intra=intra), problem, seed=8)


@pytest.mark.parametrize("name,extra", [("hierarchical", dict(prefix_block=16)),
                                        ("grouped", dict(group=4)),
                                        ("grouped", dict(group=16)),
                                        ("chunk", {})])
def test_many_chunks_span_several_prefix_blocks_and_groups(name, extra):
    # 19 chunks of 16: two log-depth blocks of 16, five groups of 4, two groups of 16
    problem = _problem(1, 300, 5, resets=True, initial_state=True, final_state=True)
    cfg = _cfg(name, chunk=16, block_m=16, num_warps=2,
               intra="walk" if extra.get("group") == 16 else "scan", **extra)
    _check(name, cfg, problem, seed=2)


@pytest.mark.parametrize("name", FAMILY)
@pytest.mark.parametrize("intra", ["scan", "walk"])
def test_resets_on_and_inside_chunk_boundaries(name, intra):
    B, L, M = 2, 50, 6
    problem = _problem(B, L, M, resets=True, initial_state=True, final_state=True)
    inputs = random_inputs(problem, seed=3)
    seg = torch.arange(L, dtype=torch.int32).repeat(B, 1) + 3
    for t in (0, 16, 32, 7, 40, 49):        # row 0: t = 0, chunk starts, inside, last step
        seg[0, t:] = torch.arange(L - t, dtype=torch.int32)
    for t in (15, 31, 33):                  # row 1: chunk ends and just after a start
        seg[1, t:] = torch.arange(L - t, dtype=torch.int32)
    cfg = _cfg(name, chunk=16, block_m=16, num_warps=2, intra=intra)
    _check(name, cfg, problem, inputs=inputs.replace(segment_pos=seg), seed=3)
    # row 0 resets at t = 0: its h0 gets no gradient; row 1 does
    assert_reset_at_t0_cuts_h0_off(lambda inp: registry.get(name).run(inp, cfg),
                                   inputs.replace(segment_pos=seg))


@pytest.mark.parametrize("name,intra", [(n, "scan") for n in FAMILY] + [("chunk", "walk")])
def test_gradient_through_the_final_state_only(name, intra):
    problem = _problem(2, 40, 6, initial_state=True, final_state=True)
    inputs = random_inputs(problem, seed=2)
    cfg = _cfg(name, chunk=16, block_m=16, num_warps=2, intra=intra)
    assert_final_state_grads_match_reference(lambda inp: registry.get(name).run(inp, cfg), inputs)


@pytest.mark.parametrize("name", FAMILY)
def test_bf16_writes_with_bf16_controls(name):
    problem = _problem(3, 35, 20, dtype="bfloat16", control_dtype="bfloat16", resets=True,
                       initial_state=True, final_state=True)
    inputs = random_inputs(problem, seed=5)
    cfg = _cfg(name, chunk=16, block_m=16, num_warps=2)
    out = registry.get(name).run(inputs, cfg)
    assert out.real.dtype == torch.bfloat16 and out.final_state[0].dtype == torch.float32
    _check(name, cfg, problem, inputs=inputs, seed=5)


@pytest.mark.parametrize("name,intra", [("chunk", "scan"), ("hierarchical", "scan"),
                                        ("grouped", "walk")])
def test_atomic_reduce_matches_reference_and_partials(name, intra):
    problem = _problem(2, 40, 37, resets=True, initial_state=True, final_state=True)
    inputs = random_inputs(problem, seed=6)
    tile = dict(chunk=16, block_m=16 if intra == "scan" else 32, num_warps=2, intra=intra)
    atomic = _cfg(name, reduce="atomic", **tile)
    partials = _cfg(name, reduce="partials", **tile)
    _check(name, atomic, problem, inputs=inputs, seed=6)

    def run(cfg):
        return grads(lambda inp: registry.get(name).run(inp, cfg), inputs,
                     lambda out: out.real.sum() - out.imag.sum() + out.final_state[1].sum())

    for a, p in zip(run(atomic), run(partials)):
        torch.testing.assert_close(a, p, rtol=1e-5, atol=1e-5)
    strat = registry.get(name)
    assert not strat.valid(problem.model_copy(update={"deterministic": True}), atomic)
    assert not strat.valid(problem.model_copy(update={"backward": False}), atomic)


@pytest.mark.parametrize("name,intra", [(n, "scan") for n in FAMILY] + [("hierarchical", "walk")])
def test_backward_is_bitwise_reproducible(name, intra):
    problem = _problem(2, 40, 20, resets=True, initial_state=True, final_state=True)
    inputs = random_inputs(problem, seed=4)
    cfg = _cfg(name, chunk=16, block_m=16, num_warps=2, intra=intra)

    def run():
        return grads(lambda inp: registry.get(name).run(inp, cfg), inputs,
                     lambda out: out.real.sum() + 3 * out.imag.sum() + out.final_state[1].sum())

    for a, b in zip(run(), run()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", FAMILY)
def test_forward_only_under_no_grad(name):
    problem = _problem(1, 21, 4, dtype="bfloat16", final_state=True, backward=False)
    inputs = random_inputs(problem, seed=1)
    strat = registry.get(name)
    assert_forward_only_under_no_grad(lambda inp: strat.run(inp, strat.default_config(problem)),
                                      inputs)


@pytest.mark.parametrize("variant", ["serial", "blocked", "grouped"])
@pytest.mark.parametrize("has_init", [False, True])
def test_prefix_kernels_against_a_loop(variant, has_init):
    # 70 chunk maps of 2 rows x 37 modes: several blocks / groups, ragged mode tiles
    B, nc, M, block_m = 2, 70, 37, 16
    g = torch.Generator().manual_seed(9)
    pq = [torch.randn(B, nc, M, generator=g) * s for s in (0.5, 0.5, 1.0, 1.0)]
    init = (torch.randn(B, M, generator=g), torch.randn(B, M, generator=g))
    carry = [torch.full((B, nc, M), float("nan")) for _ in range(2)]
    end = [torch.full((B, M), float("nan")) for _ in range(2)]
    args = (*pq, *(init if has_init else (None, None)))
    nmb = triton.cdiv(M, block_m)
    if variant == "serial":
        prefix_kernels.prefix_serial[(B * nmb,)](*args, *carry, *end, M, nc, HAS_INIT=has_init,
                                                 WRITE_END=True, BLOCK_M=block_m)
    elif variant == "blocked":
        prefix_kernels.prefix_blocked[(B * nmb,)](*args, *carry, *end, M, nc, HAS_INIT=has_init,
                                                  WRITE_END=True, BLOCK_C=16, BLOCK_M=block_m)
    else:
        group = 16
        ng = triton.cdiv(nc, group)
        gpq = [torch.full((B, ng, M), float("nan")) for _ in range(4)]
        gc = [torch.full((B, ng, M), float("nan")) for _ in range(2)]
        for expand in (False, True):
            if expand:
                prefix_kernels.prefix_serial[(B * nmb,)](*gpq, *args[4:], *gc, *end, M, ng,
                                                         HAS_INIT=has_init, WRITE_END=True,
                                                         BLOCK_M=block_m)
            prefix_kernels.group_scan[(B * ng * nmb,)](*pq, *gpq, *gc, *carry, M, nc, ng,
                                                       EXPAND=expand, GROUP=group,
                                                       BLOCK_M=block_m)
    p = torch.complex(pq[0].double(), pq[1].double())
    q = torch.complex(pq[2].double(), pq[3].double())
    z = torch.complex(*init).to(torch.complex128) if has_init else torch.zeros(
        B, M, dtype=torch.complex128)
    want = []
    for c in range(nc):
        want.append(z)
        z = p[:, c] * z + q[:, c]
    want = torch.stack(want, 1)
    torch.testing.assert_close(torch.complex(*carry).to(torch.complex128), want, rtol=1e-4,
                               atol=1e-4)
    torch.testing.assert_close(torch.complex(*end).to(torch.complex128), z, rtol=1e-4, atol=1e-4)


def test_config_space_is_pruned_and_defaults_are_valid():
    for name in FAMILY:
        strat = registry.get(name)
        for M in (1, 5, 20, 100, 1000):
            for L in (1, 3, 100, 5000):
                for det in (False, True):
                    problem = ScanProblem(B=2, L=L, M=M, deterministic=det)
                    configs = strat.configs(problem)
                    assert configs, (name, L, M)
                    assert strat.default_config(problem) in configs, (name, L, M)
                    for cfg in configs:
                        assert cfg.block_m <= max(16, triton.next_power_of_2(M))
                        assert cfg.chunk <= max(16, triton.next_power_of_2(L))
                        assert cfg.num_stages == 1 or cfg.intra == "walk"
                        if cfg.intra == "scan":
                            per_thread = cfg.chunk * cfg.block_m // (32 * cfg.num_warps)
                            assert 1 <= per_thread <= 8
                        else:
                            assert 32 * cfg.num_warps <= max(128, 4 * cfg.block_m)
                        assert not (det and cfg.reduce == "atomic")
    big = ScanProblem(B=8, L=8192, M=1024)
    sizes = {name: len(registry.get(name).configs(big)) for name in FAMILY}
    assert sizes["chunk"] < sizes["hierarchical"] < sizes["grouped"], sizes
    # coordinate descent (one field at a time) reaches the walk from every default
    for name in FAMILY:
        strat = registry.get(name)
        for problem in (big, ScanProblem(B=2, L=100, M=20), ScanProblem(B=1, L=5, M=3)):
            cfg = strat.default_config(problem)
            assert strat.valid(problem, cfg.model_copy(update={"intra": "walk"})), (name, cfg)
    # grouped: at least two groups unless the row has few chunks
    few = ScanProblem(B=2, L=100, M=64)       # 4 chunks of 32 at most 7 of 16
    assert {c.group for c in registry.get("grouped").configs(few)} == {4}


def test_capability_and_priorities():
    for name, prio in (("chunk", 9), ("grouped", 8), ("hierarchical", 7)):
        strat = registry.get(name)
        cap = strat.capability
        assert strat.priority == prio
        assert cap.deterministic and cap.triton and cap.devices == {"cuda"}
        assert cap.resets and cap.initial_state and cap.final_state and cap.backward
        assert cap.max_modes is None and cap.max_length is None


def test_workspace_counts_summaries_carries_and_partials():
    problem = ScanProblem(B=2, L=100, M=64, backward=True)
    cfg = ChunkConfig(chunk=32, block_m=32, num_warps=4)
    nc = 4
    fwd = 6 * 2 * nc * 64 + 2 * 2 * 64
    bwd = 2 * 2 * 100 * 2 + 2 * 2 * nc * 64 + 4 * 2 * 64
    assert registry.get("chunk").workspace_bytes(problem, cfg) == 4 * (fwd + bwd)
    forward = problem.model_copy(update={"backward": False})
    assert registry.get("chunk").workspace_bytes(forward, cfg) == 4 * fwd
    grouped = registry.get("grouped").workspace_bytes(forward, GroupedConfig(
        chunk=32, block_m=32, num_warps=4, group=4))
    assert grouped == 4 * (fwd + 6 * 2 * 1 * 64)
    atomic = registry.get("chunk").workspace_bytes(problem, cfg.model_copy(
        update={"reduce": "atomic"}))
    assert atomic == 4 * (fwd + 2 * 2 * 100 + 2 * 64 + 4 * 2 * 64)


# ---- GPU -------------------------------------------------------------------------------

_GPU_CFGS = {
    "chunk": ChunkConfig(chunk=32, block_m=64, num_warps=8),
    "hierarchical": HierarchicalConfig(chunk=64, block_m=32, num_warps=8, prefix_block=16),
    "grouped": GroupedConfig(chunk=32, block_m=32, num_warps=4, group=4),
    "chunk-walk": ChunkConfig(chunk=64, block_m=128, num_warps=4, intra="walk", num_stages=2),
    "grouped-walk": GroupedConfig(chunk=128, block_m=64, num_warps=2, group=4, intra="walk"),
}
_GPU_CASES = sorted(_GPU_CFGS)


@pytest.mark.gpu
@pytest.mark.parametrize("case", _GPU_CASES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_gpu_every_member_at_a_larger_shape(case, dtype):
    problem = ScanProblem(B=3, L=1000, M=200, dtype=dtype, device="cuda", resets=True,
                          initial_state=True, final_state=True)
    cfg = _GPU_CFGS[case]
    name = case.split("-")[0]
    strat = registry.get(name)
    assert strat.valid(problem, cfg)
    failure = verify(lambda inp: strat.run(inp, cfg), random_inputs(problem, seed=1), problem,
                     seed=1)
    assert failure is None, f"{name} {cfg!r}: {failure}"
    atomic = cfg.model_copy(update={"reduce": "atomic"})
    failure = verify(lambda inp: strat.run(inp, atomic), random_inputs(problem, seed=2),
                     problem, seed=2)
    assert failure is None, f"{name} {atomic!r}: {failure}"


@pytest.mark.gpu
@pytest.mark.parametrize("case", _GPU_CASES)
def test_a_new_shape_does_not_recompile(case):
    from samu_tune.kernels import chunk as chunk_kernels
    from samu_tune.settings import settings
    if settings().interpret:
        pytest.skip("counts compiled binaries: needs TRITON_INTERPRET=0")
    kernels = [chunk_kernels.chunk_summary, chunk_kernels.chunk_replay,
               prefix_kernels.prefix_serial, prefix_kernels.prefix_blocked,
               prefix_kernels.group_scan]
    cfg = _GPU_CFGS[case]
    name = case.split("-")[0]
    # L, M, chunk counts differ in divisibility by 16 and in being 1
    shapes = [(2, 37, 20), (3, 640, 48), (1, 1, 1), (4, 1029, 97)]
    counts = binaries_over_shapes(lambda inp: registry.get(name).run(inp, cfg), kernels, shapes,
                                  f"{name} ")
    assert counts[0][0] >= 2 and counts[0][1] >= 2, counts   # forward and reverse
    assert all(c == counts[0] for c in counts[1:]), counts
