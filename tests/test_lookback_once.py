"""The ``lookback_once`` strategy: the look-back scan whose forward stages each chunk in shared
memory (a Gluon kernel).  Its forward runs on CUDA only; on the CPU the tests check what the
strategy admits and that it says why it cannot run under the interpreter."""
import pytest
import torch

from samu_tune import registry
from samu_tune.device import device_info
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.strategies import lookback, lookback_once as once
from samu_tune.ops.scan.strategies.lookback_config import LookbackConfig
from samu_tune.ops.scan.verify import random_inputs, verify
from samu_tune.tolerances import TOLERANCES, relative_error

from _helpers import assert_large_training_matches_lookback

STRATEGY = registry.get("lookback_once")


def _problem(B, L, M, dtype="float32", backward=True, device="cuda", **features):
    return ScanProblem(B=B, L=L, M=M, dtype=dtype, device=device, backward=backward,
                       **features)


def _cuda_reasons(problem):
    """The capability's reasons for a CUDA problem, less the interpreter's (CI runs under it)."""
    return [r for r in STRATEGY.capability.reasons(problem) if "interpreter" not in r]


def test_capability_and_configs():
    """CPU and interpreter excluded with a reason; M a multiple of 8; decoupled loop configs
    of 32- and 64-step chunks, the same for forward and training."""
    cpu = _problem(2, 100, 16, device="cpu")
    assert any("interpreter" in r for r in STRATEGY.reasons(cpu, device_info("cpu")))
    assert any("multiple of 8" in r for r in _cuda_reasons(_problem(2, 100, 20)))
    assert not _cuda_reasons(_problem(2, 100, 24))
    fwd = _problem(8, 8192, 1024, "bfloat16", backward=False)
    configs = STRATEGY.configs(fwd)
    assert configs and STRATEGY.default(fwd) in configs
    assert all(c.inner == "loop" and c.lookback == "decoupled" and c.chunk in (32, 64)
               for c in configs)
    assert all(once.staged_bytes(fwd, c) <= once._MAX_STAGED_BYTES for c in configs)
    train = _problem(8, 8192, 1024, "bfloat16")
    assert STRATEGY.default(train) in STRATEGY.configs(train)
    # the backward's fields are checked as training's: a forward config serves training
    assert configs == STRATEGY.configs(train)
    assert LookbackConfig(chunk=64, block_m=512, num_warps=4, inner="loop") in configs
    assert LookbackConfig(chunk=128, block_m=256, num_warps=2, inner="loop") not in configs
    assert not STRATEGY.configs(_problem(8, 8192, 1024, deterministic=True))


def test_fit_narrows_the_mode_tile_where_it_covers_fewer_modes():
    """A nearest entry's 256-mode tile becomes 128 modes where M leaves half a tile idle
    (M = 384: two tiles of 256 cover 512 modes, three of 128 cover 384), at 2 warps at least;
    the training default does the same; where 256 covers no more, nothing changes."""
    assert once.fitted_tile(384, 256, 2) == (128, 2)
    assert once.fitted_tile(384, 512, 4) == (128, 2)
    assert once.fitted_tile(1000, 256, 2) == (256, 2)      # 1024 modes either way
    assert once.fitted_tile(2048, 512, 4) == (512, 4)
    assert once.fitted_tile(640, 512, 4) == (128, 2)
    near = LookbackConfig(chunk=32, block_m=256, num_warps=2, inner="loop")
    fwd = _problem(24, 700, 384, "bfloat16", backward=False)
    assert STRATEGY.fit(fwd, near) == near.model_copy(update={"block_m": 128})
    train = _problem(24, 700, 384, "bfloat16")
    assert STRATEGY.default(train).block_m == 128
    staged = LookbackConfig(chunk=64, block_m=256, num_warps=2, inner="loop", rows=2, stages=6)
    assert STRATEGY.fit(train, staged) == staged.model_copy(update={"block_m": 128})
    big = _problem(8, 8192, 1024, "bfloat16", backward=False)
    assert STRATEGY.fit(big, near) is near
    assert STRATEGY.default(big.model_copy(update={"backward": True})).block_m == 256


def test_forward_default_is_64_steps_of_128_modes():
    """The forward default: 64-step chunks of 128 modes at 2 warps, at any M (a 128-mode tile
    never covers more padded modes than a wider one)."""
    for M in (96, 256, 384, 1024, 4096):
        cfg = STRATEGY.default(_problem(4, 4096, M, "bfloat16", backward=False))
        assert (cfg.chunk, cfg.block_m, cfg.num_warps) == (64, 128, 2), M


# ---- GPU -----------------------------------------------------------------------------------

_CONFIGS = [
    LookbackConfig(chunk=64, block_m=256, num_warps=2, inner="loop"),
    LookbackConfig(chunk=32, block_m=256, num_warps=2, inner="loop"),
    LookbackConfig(chunk=64, block_m=512, num_warps=4, inner="loop", rows=2, stages=4),
    LookbackConfig(chunk=64, block_m=128, num_warps=2, inner="loop", lookback_width=8,
                   stages=6),
]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", _CONFIGS, ids=lambda c: f"c{c.chunk}-m{c.block_m}-w{c.num_warps}"
                         f"-r{c.rows}-lw{c.lookback_width}-p{c.stages}")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_matches_reference(cfg, dtype):
    """Forward and every gradient against the float64 reference: many chunks (L ragged
    against every chunk), ragged mode tiles (M = 136, 520), resets, h0 and final state or
    neither."""
    ran = 0
    for (B, L, M), state in [((2, 1000, 136), True), ((1, 333, 520), True), ((3, 64, 8), True),
                             ((2, 1000, 136), False)]:
        problem = _problem(B, L, M, dtype, resets=True, initial_state=state, final_state=state)
        if not STRATEGY.valid(problem, cfg):
            continue              # e.g. fp32 chunks over the shared memory limit
        ran += 1
        inputs = random_inputs(problem, seed=L, device="cuda", reset_rate=0.01)
        failure = verify(lambda inp: STRATEGY.run(inp, cfg), inputs, problem, seed=L)
        assert failure is None, (B, L, M, state, failure)
    assert ran or dtype == "float32"


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(8, 8192, 1024), (4, 16384, 256), (1, 100000, 96)])
def test_gpu_large_shapes_match_lookback(shape):
    """Thousands of chunks in flight, repeated: the default config's outputs and final state
    against the ``lookback`` strategy's (the float64 reference walks L in Python: too slow
    here), in relative norm; a lost publication would read an unwritten summary."""
    B, L, M = shape
    problem = _problem(B, L, M, "bfloat16", backward=False, initial_state=True,
                       final_state=True, resets=True)
    inputs = random_inputs(problem, seed=B, device="cuda", reset_rate=0.001)
    lookback = registry.get("lookback")
    want = lookback.run(inputs, lookback.default(problem))
    cfg = STRATEGY.default(problem)
    for _ in range(5):
        got = STRATEGY.run(inputs, cfg)
        for g, w in ((got.real, want.real), (got.imag, want.imag),
                     (got.final_state[0], want.final_state[0]),
                     (got.final_state[1], want.final_state[1])):
            assert relative_error(g, w) <= TOLERANCES["bfloat16"].forward
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(8, 4096, 1024), (2, 65536, 128)])
def test_gpu_large_training_matches_lookback(shape, monkeypatch):
    """Training at thousands of chunks: outputs and every gradient (resets, h0, final state)
    against the ``lookback`` strategy's, in relative norm, with the default training config
    (the same config as ``lookback``'s here: the read-once forward is what differs, and the
    test checks it ran)."""
    from samu_tune.ops.scan.strategies import lookback as lb
    read_once, launches = lb.ONCE_FORWARD, []

    class Counting:
        can_run = staticmethod(read_once.can_run)

        @staticmethod
        def launch(*args):
            launches.append(args[0])
            read_once.launch(*args)

    monkeypatch.setattr(lb, "ONCE_FORWARD", Counting)
    assert_large_training_matches_lookback(STRATEGY, shape, launches)


@pytest.mark.gpu
@pytest.mark.parametrize("programs", [1, 3, 7])
def test_gpu_persistent_programs_walk_many_chunks(programs, monkeypatch):
    """Fewer programs than chunks (the device's count replaced by 1, 3 or 7): each program
    walks chunk after chunk, refilling its staged rows as it replays, and the results are
    the float64 reference's (resets, h0, final state; ragged L and M), launch after launch
    on the same head (a ticket not given back would shift the next launch's chunks)."""
    monkeypatch.setattr(once.occupancy, "resident_programs", lambda kernel, device: programs)
    monkeypatch.setattr(once, "_GRID", once.occupancy.PersistentGrid())
    for (B, L, M), dtype in [((2, 1000, 136), "float32"), ((3, 700, 256), "bfloat16")]:
        problem = _problem(B, L, M, dtype, backward=False, resets=True, initial_state=True,
                           final_state=True)
        cfg = STRATEGY.default(problem)
        inputs = random_inputs(problem, seed=L, device="cuda", reset_rate=0.01)
        STRATEGY.run(inputs, cfg)              # the first launch: a program per chunk
        assert [v[1] for v in once._GRID._kept.values()] == [programs]
        for _ in range(3):
            failure = verify(lambda inp: STRATEGY.run(inp, cfg), inputs, problem, seed=L)
            assert failure is None, ((B, L, M), programs, failure)
        monkeypatch.setattr(once, "_GRID", once.occupancy.PersistentGrid())


def test_launch_caps_the_grid_at_the_programs_the_device_runs(monkeypatch):
    """The first launch of a specialisation runs a program per chunk and reads the device's
    count from the compiled kernel; later launches run min(chunks, that count); an unknown
    count keeps a program per chunk.  The kernel is a recording stub here."""
    grids, compiled = [], object()

    class Stub:
        @staticmethod
        def launch(grid, args, kwargs):
            grids.append(grid)
            return compiled

    counts = {}
    monkeypatch.setattr(once, "_once_kernel", Stub)
    monkeypatch.setattr(once, "_GRID", once.occupancy.PersistentGrid())
    monkeypatch.setattr(once.occupancy, "resident_programs",
                        lambda kernel, device: counts.get("n") if kernel is compiled else -1)
    plan = lookback.LookbackPlan.of(LookbackConfig(chunk=64, block_m=128, num_warps=2,
                                                   inner="loop"), once=True)
    x = (torch.zeros(4, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.bfloat16))
    args = (None, None, None, None, None, None, None, None, x, (None, None), x, (None, None),
            2, 8192, 1024, 8, 128, 0, 0)
    counts["n"] = 792
    for _ in range(3):
        once.launch(plan, 2048, *args)
    once.launch(plan, 500, *args)
    assert grids == [(2048,), (792,), (792,), (500,)]
    grids.clear()
    counts["n"] = None
    once.launch(plan, 2048, *args[:9], (x[0], x[1]), *args[10:])     # h0: another key
    once.launch(plan, 2048, *args[:9], (x[0], x[1]), *args[10:])
    assert grids == [(2048,), (2048,)]


@pytest.mark.gpu
def test_gpu_unaligned_rows_fall_back():
    """br at an odd element offset: the forward runs the Triton walk instead, the same
    results up to rounding: the Gluon forward's summary forms P in closed form, and ptxas may
    contract A's products into FMAs differently, so a stored bf16 value can round the other
    way (on an H100, 3.5e-6 relative to the norm: single elements one bf16 ulp apart)."""
    problem = _problem(2, 300, 64, "bfloat16", backward=False, final_state=True)
    inputs = random_inputs(problem, seed=3, device="cuda")
    shifted = torch.empty(inputs.br.numel() + 1, dtype=inputs.br.dtype, device="cuda")
    br = shifted[1:].view_as(inputs.br)
    br.copy_(inputs.br)
    cfg = STRATEGY.default(problem)
    got = STRATEGY.run(inputs.replace(br=br), cfg)
    want = STRATEGY.run(inputs, cfg)
    for g, w in ((got.real, want.real), (got.imag, want.imag),
                 (got.final_state[0], want.final_state[0])):
        assert relative_error(g, w) <= 1e-4


def test_rule_takes_it_for_large_cuda_scans():
    """With a CUDA device (and no interpreter), the rule picks the read-once scan from B L M =
    2^24, forward and training (``lookback_staged``: ``lookback_once``'s forward, the staged
    backward), and ``lookback`` below; under the interpreter neither is eligible, so the
    rule's answer falls through to ``lookback``."""
    from samu_tune import rule_choice
    from samu_tune.device import DeviceInfo
    from samu_tune.settings import environment, reload_settings
    h100 = DeviceInfo(kind="cuda", name="NVIDIA H100 80GB HBM3", capability=(9, 0),
                      sm_count=132)
    once = "lookback_staged"
    cases = {((8, 8192, 1024), False): once, ((8, 8192, 1024), True): once,
             ((4, 16384, 256), False): once, ((4, 16384, 256), True): once,
             ((2, 65536, 128), True): once, ((4, 4096, 512), True): "lookback",
             ((4, 4096, 512), False): "lookback", ((3, 5000, 304), False): "lookback"}
    try:
        for interpret, want_once in (("0", True), ("1", False)):
            with environment(TRITON_INTERPRET=interpret):
                reload_settings()
                for ((B, L, M), backward), want in cases.items():
                    choice = rule_choice(_problem(B, L, M, "bfloat16", backward=backward), h100)
                    expected = want if want_once else "lookback"
                    assert choice.strategy.name == expected, ((B, L, M), backward, choice.why)
                    assert choice.strategy.valid(_problem(B, L, M, "bfloat16",
                                                          backward=backward), choice.config)
    finally:
        reload_settings()


def test_once_plan_forward_launches_on_the_launch_head(monkeypatch):
    """A ``once`` plan's forward goes to the read-once launch with the look-back launch's own
    programs, head and summaries; where ``can_run`` refuses (or backward), the Triton kernel
    runs and the results are the reference's.  The Gluon launch is a recording stub here (the
    interpreter cannot run Gluon)."""
    from samu_tune import scratch
    from samu_tune.ops.scan.strategies import lookback as lb
    from samu_tune.ops.scan.strategies.lookback import LookbackPlan

    calls = []

    class Stub:
        ok = True

        @staticmethod
        def can_run(M, *rows):
            return Stub.ok and len(rows) == 4

        @staticmethod
        def launch(plan, slots, sync, carry, *args):
            calls.append((plan.once, slots, carry.numel(), args[-7:-2]))

    monkeypatch.setattr(lb, "ONCE_FORWARD", Stub)
    plan = LookbackPlan.of(LookbackConfig(chunk=32, block_m=64, num_warps=2, inner="loop"),
                           once=True)
    problem = _problem(2, 70, 16, device="cpu", backward=False)
    inputs = random_inputs(problem, seed=0)
    try:
        with torch.no_grad():
            lb.lookback_scan(inputs, plan)
        # B * one mode tile * three 32-step chunks; B L M as passed
        assert calls == [(True, 6, lb._carry_words(2, 70, 16, plan), (2, 70, 16, 1, 3))]
        Stub.ok = False
        with torch.no_grad():
            out = lb.lookback_scan(inputs, plan)
        assert len(calls) == 1
        ref = registry.get("reference")
        want = ref.run(inputs, ref.default_config(problem))
        assert relative_error(out.real, want.real) <= 1e-5
    finally:
        scratch.clear()       # the stub ran nothing on the kept head


def test_resident_programs_from_the_driver_or_shared_memory(monkeypatch):
    """The device's count of a compiled kernel: the driver's blocks per SM times the SMs;
    where the driver cannot say, shared memory per SM over the kernel's (plus the block's
    reserve); None for an object that is not a compiled kernel or a device that is not a
    GPU."""
    from types import SimpleNamespace
    from samu_tune import occupancy
    props = SimpleNamespace(multi_processor_count=132, major=9, minor=0)
    monkeypatch.setattr(occupancy.torch.cuda, "get_device_properties", lambda device: props)
    kernel = SimpleNamespace(function=1234, metadata=SimpleNamespace(num_warps=2, shared=33024))
    monkeypatch.setattr(occupancy, "blocks_per_sm", lambda function, threads, shared: 5)
    assert occupancy.resident_programs(kernel, "cuda") == 660
    monkeypatch.setattr(occupancy, "blocks_per_sm", lambda function, threads, shared: None)
    assert occupancy.resident_programs(kernel, "cuda") == 6 * 132     # 228 KB // 33 KB
    assert occupancy.resident_programs(object(), "cuda") is None
    assert occupancy.resident_programs(None, "cuda") is None
    # not a GPU (a compile worker's CPU tensors): not asked, whatever the driver would say
    assert occupancy.resident_programs(kernel, torch.device("cpu")) is None
