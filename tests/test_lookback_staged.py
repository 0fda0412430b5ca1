"""The ``lookback_staged`` strategy: ``lookback_once``'s read-once forward and a backward that
stages d out in shared memory too (Gluon).  CUDA only; on the CPU the tests check what the
strategy admits and that it leaves ``lookback_once`` as it was."""
import pytest
import torch

from samu_tune import registry
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.strategies import lookback_staged as staged
from samu_tune.ops.scan.strategies.lookback_config import LookbackConfig
from samu_tune.ops.scan.verify import random_inputs, verify

from _helpers import assert_large_training_matches_lookback

STRATEGY = registry.get("lookback_staged")
ONCE = registry.get("lookback_once")


def _problem(B, L, M, dtype="float32", backward=True, device="cuda", **features):
    return ScanProblem(B=B, L=L, M=M, dtype=dtype, device=device, backward=backward,
                       **features)


def test_configs_are_lookback_once_configs_without_the_triton_walk_fields():
    """Every config is a ``lookback_once`` config with rows 1, stages 1 and look-back width 1
    (fields only the Triton backward walk reads); the same capability."""
    for problem in (_problem(8, 8192, 1024, "bfloat16"), _problem(4, 16384, 256, "bfloat16"),
                    _problem(8, 8192, 1024, "bfloat16", backward=False)):
        configs = STRATEGY.configs(problem)
        assert configs and STRATEGY.default(problem) in configs
        assert set(configs) <= set(ONCE.configs(problem))
        assert all(c.rows == 1 and c.stages == 1 and c.lookback_width == 1 for c in configs)
    assert STRATEGY.capability == ONCE.capability
    assert not STRATEGY.valid(_problem(8, 8192, 1024, "bfloat16"), LookbackConfig(
        chunk=64, block_m=256, num_warps=2, inner="loop", stages=6))


def test_training_default_follows_the_width_of_the_problem():
    """32-step chunks of 256 modes where B M >= 8192 and M >= 256 (narrowed where 128-mode
    tiles cover fewer modes), else 64-step chunks of 128 modes; forward: lookback_once's."""
    def spec(B, L, M, backward=True):
        c = STRATEGY.default(_problem(B, L, M, "bfloat16", backward=backward))
        return c.chunk, c.block_m, c.num_warps
    assert spec(8, 8192, 1024) == (32, 256, 2)
    assert spec(16, 1024, 1024) == (32, 256, 2)
    assert spec(24, 700, 384) == (32, 128, 2)
    assert spec(4, 16384, 256) == (64, 128, 2)
    assert spec(1, 16384, 256) == (64, 128, 2)
    assert spec(8, 8192, 1024, backward=False) == (64, 128, 2)


def test_backward_runs_the_gluon_kernel_only_on_aligned_rows_of_one_size():
    """The staged backward needs 16-byte aligned rows of one element size (else the Triton
    walk runs)."""
    x = torch.zeros(2, 4, 16, dtype=torch.bfloat16)
    shifted = torch.zeros(x.numel() + 1, dtype=torch.bfloat16)[1:].view_as(x)   # 2 bytes off
    assert staged.can_run_backward(16, x, x)
    assert not staged.can_run_backward(16, x, x.float())
    assert not staged.can_run_backward(16, x, shifted)
    assert not staged.can_run_backward(12, x, x)


# ---- GPU -----------------------------------------------------------------------------------

_CONFIGS = [
    LookbackConfig(chunk=64, block_m=128, num_warps=2, inner="loop"),
    LookbackConfig(chunk=32, block_m=256, num_warps=2, inner="loop"),
    LookbackConfig(chunk=32, block_m=128, num_warps=2, inner="loop"),
    LookbackConfig(chunk=64, block_m=512, num_warps=4, inner="loop"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", _CONFIGS, ids=lambda c: f"c{c.chunk}-m{c.block_m}-w{c.num_warps}")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_matches_reference(cfg, dtype):
    """Forward and every gradient against the float64 reference: many chunks (L ragged
    against every chunk), ragged mode tiles (M = 136, 520), resets, h0 and final state or
    neither, and one of the two."""
    ran = 0
    for (B, L, M), h0, final in [((2, 1000, 136), True, True), ((1, 333, 520), True, True),
                                 ((3, 64, 8), True, True), ((2, 1000, 136), False, False),
                                 ((2, 97, 264), False, True), ((1, 130, 128), True, False)]:
        problem = _problem(B, L, M, dtype, resets=True, initial_state=h0, final_state=final)
        if not STRATEGY.valid(problem, cfg):
            continue              # e.g. fp32 chunks over the shared memory limit
        ran += 1
        inputs = random_inputs(problem, seed=L, device="cuda", reset_rate=0.01)
        failure = verify(lambda inp: STRATEGY.run(inp, cfg), inputs, problem, seed=L)
        assert failure is None, (B, L, M, h0, final, failure)
    assert ran or dtype == "float32"


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(8, 4096, 1024), (2, 65536, 128)])
def test_gpu_large_training_matches_lookback(shape, monkeypatch):
    """Training at thousands of chunks: outputs and every gradient (resets, h0, final state)
    against the ``lookback`` strategy's, in relative norm, with the default training config;
    the staged backward ran once (a lost publication would read an unwritten summary)."""
    launches = []
    real = staged._launch_backward

    def counting(*args, **kwargs):
        launches.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(staged, "_launch_backward", counting)
    assert_large_training_matches_lookback(STRATEGY, shape, launches)
