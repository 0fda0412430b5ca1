"""The tuner's compile pool (samu_tune.compile_pool): workers verify candidates ahead of
timing; a candidate a worker cannot judge is verified by the tuning process."""
from __future__ import annotations

import contextlib
import os
import sys

import pytest

from samu_tune import compile_pool, registry, tune
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.settings import settings

PROBLEM = ScanProblem(B=2, L=40, M=24, dtype="float32", device="cpu", backward=True)
# a GPU problem whose binaries compile workers build without a GPU
GPU_PROBLEM = ScanProblem(B=8, L=8192, M=1024, dtype="bfloat16", device="cuda", backward=True)


@contextlib.contextmanager
def _sm90_compile_pool(problem=GPU_PROBLEM):
    """A one-worker pool in ``compile`` mode on ``problem``, building for sm_90 (an H200's
    device info) on CPU tensors; closed, and the shared workers stopped, after."""
    import torch
    from samu_tune.device import DeviceInfo
    h200 = DeviceInfo(kind="cuda", name="NVIDIA H200", capability=(9, 0), sm_count=132)
    pool = compile_pool.CompilePool(problem, torch.device("cpu"), 0, 1, mode="compile",
                                    target=("cuda", 90, 32), info=h200)
    try:
        yield pool
    finally:
        pool.close()
        compile_pool._stop_shared()


def _wait_until_a_worker_starts(pool, strategy: str, config: dict) -> None:
    """Block until a worker has claimed the job (started it)."""
    import time
    path = pool._claim_path(pool.key(strategy, config))
    deadline = time.monotonic() + 300
    while not os.path.exists(path):
        assert time.monotonic() < deadline, "no worker started the job"
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def _interpreter():
    if not settings().interpret:
        pytest.skip("the CPU problem needs TRITON_INTERPRET=1")


def test_job_verifies_a_builtin_candidate_and_cannot_judge_an_unknown_one():
    cfg = registry.get("serial").default_config(PROBLEM).model_dump(mode="json")
    status, failure, seconds, on = compile_pool._job(
        "scan", PROBLEM.model_dump(mode="json"), "serial", cfg, 0, "cpu")
    assert status == "verified" and failure is None and seconds > 0
    assert on == "B2-L40-M24-f32-train"
    status, failure, _, _ = compile_pool._job(
        "scan", PROBLEM.model_dump(mode="json"), "no_such_strategy", {}, 0, "cpu")
    assert status == "unknown" and "no_such_strategy" in failure


@pytest.mark.slow
def test_tune_with_workers_matches_tune_without():
    # exhaustive: the candidates' order does not depend on their (CPU, noisy) times
    kw = dict(max_configs=4, strategies=["serial", "lookback"], reps=2, exhaustive=True)
    alone = tune(PROBLEM, compile_workers=0, **kw)
    pooled = tune(PROBLEM, compile_workers=2, **kw)
    evaluated = [c for c in pooled.candidates if c.status != "skipped"]
    assert [(c.name, c.status) for c in pooled.candidates] == \
        [(c.name, c.status) for c in alone.candidates]
    assert all(c.verified_in is None for c in alone.candidates)
    # a candidate reached before a worker started it is verified by the tuning process
    assert evaluated and all(c.verified_in in ("worker", None) for c in evaluated)
    assert all(c.verified_on == a.verified_on
               for c, a in zip(pooled.candidates, alone.candidates))


def test_a_workers_verdict_stands_once_it_started_the_job():
    import torch
    serial = registry.get("serial")
    good = serial.default_config(PROBLEM).model_dump(mode="json")
    pool = compile_pool.CompilePool(PROBLEM, torch.device("cpu"), 0, 1)
    try:
        assert pool.mode == "verify"
        pool.submit("serial", good)
        _wait_until_a_worker_starts(pool, "serial", good)
        verdict = pool.verdict("serial", good)              # waits for the worker's run
        assert verdict is not None and verdict.failure is None
        assert verdict.verified_on == "B2-L40-M24-f32-train" and verdict.seconds > 0
        assert (pool.finished, pool.taken_back) == (1, 0)
    finally:
        pool.close()
    assert not os.path.exists(pool._claims)                 # close removes the claims


def test_the_callers_main_module_is_hidden_while_workers_start():
    main = sys.modules["__main__"]
    had_file = "__file__" in main.__dict__
    before = (main.__dict__.get("__file__"), main.__dict__.get("__spec__"))
    with compile_pool._main_hidden():
        assert "__file__" not in main.__dict__ and main.__spec__ is None
    assert ("__file__" in main.__dict__) == had_file
    assert (main.__dict__.get("__file__"), main.__dict__.get("__spec__")) == before


def test_no_pool_unless_asked_for():
    import torch
    from samu_tune.tuner import _compile_pool
    assert compile_pool.suggested_workers(torch.device("cpu")) == 0
    assert _compile_pool(PROBLEM, torch.device("cpu"), 0, None, 10) is None
    assert _compile_pool(PROBLEM, torch.device("cpu"), 0, 2, 1) is None   # one candidate


def test_suggested_workers_share_the_host_between_tuning_processes(monkeypatch):
    import torch
    monkeypatch.setattr(compile_pool.os, "cpu_count", lambda: 16)
    cuda = torch.device("cuda")
    assert compile_pool.suggested_workers(cuda) == 8          # at most 8
    assert compile_pool.suggested_workers(cuda, processes=4) == 3   # 16 // 4 - 1
    assert compile_pool.suggested_workers(cuda, processes=16) == 0
    assert compile_pool.suggested_workers(cuda, processes=0) == 8
    monkeypatch.setattr(compile_pool.os, "cpu_count", lambda: None)
    assert compile_pool.suggested_workers(cuda) == 0


@pytest.mark.parametrize("flag, env, device, want", [
    (None, {}, "cuda", 8),                                       # profile on a GPU: a pool
    (None, {}, "cpu", 0),                                        # the interpreter: none
    (0, {}, "cuda", 0),                                          # --compile-workers 0
    (3, {"SAMU_TUNE_COMPILE_WORKERS": "5"}, "cuda", 3),          # the flag over the variable
    (None, {"SAMU_TUNE_COMPILE_WORKERS": "0"}, "cuda", 0),
    (None, {"SAMU_TUNE_COMPILE_WORKERS": "5"}, "cpu", 5),
    (None, {"SAMU_TUNE_COMPILE_MODE": "verify"}, "cuda", 0),     # verify pools stay opt-in
    (None, {"WORLD_SIZE": "2"}, "cuda", 7),                      # 16 // 2 - 1
])
def test_profile_compiles_ahead_on_a_gpu_by_default(monkeypatch, flag, env, device, want):
    import argparse
    from samu_tune.cli import profile
    from samu_tune.settings import reload_settings
    monkeypatch.setattr(compile_pool.os, "cpu_count", lambda: 16)
    for name in ("SAMU_TUNE_COMPILE_WORKERS", "SAMU_TUNE_COMPILE_MODE", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    reload_settings()
    try:
        assert profile._compile_workers(argparse.Namespace(compile_workers=flag),
                                        device) == want
    finally:
        monkeypatch.undo()
        reload_settings()


def test_compile_mode_builds_the_gpu_binaries_without_a_gpu(tmp_path, monkeypatch):
    # compile workers: no CUDA, the launches compiled for sm_90 into the Triton cache the
    # workers inherit; a job no worker has started is taken back by the tuner, whether it
    # waits in the executor (cancelled) or was handed to the busy worker's queue (claimed)
    from samu_tune.results import config_json
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    configs = [config_json(c) for c in registry.get("lookback").configs(GPU_PROBLEM)[:3]]
    with _sm90_compile_pool() as pool:
        for cfg in configs:
            pool.submit("lookback", cfg)
        pool.submit("no_such_strategy", {})
        assert pool.verdict("lookback", configs[2]) is None and pool.taken_back == 1
        _wait_until_a_worker_starts(pool, "lookback", configs[0])
        # the one worker compiles configs[0] (seconds); configs[1] sits in its queue
        assert not pool._jobs[pool.key("lookback", configs[1])].cancel()
        assert pool.verdict("lookback", configs[1]) is None and pool.taken_back == 2
        assert pool.verdict("lookback", configs[0]) is None     # waits: the worker runs it
        assert pool.compiled == 1 and pool.taken_back == 2
        status, failure, _, _ = pool._jobs[pool.key("lookback", configs[1])].result()
        assert (status, failure) == ("unknown", "taken back")   # the worker skipped it
        status, failure, _, _ = pool._jobs[pool.key("no_such_strategy", {})].result()
        assert status == "unknown" and "no_such_strategy" in failure
    # the forward and the backward look-back binaries (REVERSE), for sm_90
    cubins = sorted(tmp_path.rglob("lookback_scan.cubin"))
    assert len(cubins) >= 2
    metadata = [p.with_suffix(".json").read_text() for p in cubins]
    assert all('"arch": "sm90' in m or '"arch": 90' in m for m in metadata), metadata[0][:300]


def test_compile_mode_builds_the_read_once_kernels_forward_and_backward(tmp_path, monkeypatch):
    # the Gluon forward's persistent grid asks the device how many programs fit after the
    # first launch; in a compile worker (CPU tensors, no GPU) it must not ask, so that the
    # candidate's run goes on to the backward and the worker compiles that binary too
    from samu_tune.results import config_json
    if "lookback_staged" not in [s.name for s in registry.all_strategies()]:
        pytest.skip("this Triton has no Gluon: the read-once strategies are not registered")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    cfg = config_json(registry.get("lookback_staged").default_config(GPU_PROBLEM))
    with _sm90_compile_pool() as pool:
        pool.submit("lookback_staged", cfg)
        _wait_until_a_worker_starts(pool, "lookback_staged", cfg)
        assert pool.verdict("lookback_staged", cfg) is None     # waits: the worker runs it
        status, failure, _, _ = pool._jobs[pool.key("lookback_staged", cfg)].result()
        assert (status, failure) == ("compiled", None)
        assert pool.compiled == 1
    names = {p.stem for p in tmp_path.rglob("*.cubin")}
    assert {"lookback_once_forward", "lookback_once_backward"} <= names, names


def test_compile_mode_builds_the_linear_ops_binaries(tmp_path, monkeypatch):
    # the linear op's kernels take a compile worker's CPU tensors (their launches compile for
    # the GPU), as the scan's do: its candidates are compiled ahead too
    from samu_tune.ops.linear.problem import LinearProblem
    from samu_tune.results import config_json
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    problem = LinearProblem(B=4, L=4096, D=512, dtype="bfloat16", device="cuda", backward=True)
    cfg = config_json(registry.get("serial", "linear").default_config(problem))
    with _sm90_compile_pool(problem) as pool:
        pool.submit("serial", cfg)
        _wait_until_a_worker_starts(pool, "serial", cfg)
        assert pool.verdict("serial", cfg) is None              # waits: the worker runs it
        status, failure, _, _ = pool._jobs[pool.key("serial", cfg)].result()
        assert (status, failure) == ("compiled", None)
    assert {p.stem for p in tmp_path.rglob("*.cubin")} == {"linear_serial_scan"}


def test_compile_mode_hands_no_layer_candidate_to_a_worker():
    # a layer candidate's look-back config is the scan dispatch's pick on the tensors'
    # device, the CPU's in a worker: no job (the tuning process compiles them), no worker
    from samu_tune.ops.layer.problem import LayerProblem
    problem = LayerProblem(B=4, L=4096, M=512, dtype="bfloat16", device="cuda", backward=True)
    with _sm90_compile_pool(problem) as pool:
        pool.submit("fused", {})
        assert pool.submitted == 0 and pool.verdict("fused", {}) is None
    import torch
    verify = compile_pool.CompilePool(problem.model_copy(update=dict(device="cpu")),
                                      torch.device("cpu"), 0, 1, mode="verify")
    assert verify._ahead                      # verify mode: a worker runs it on the device
    verify.close()


@pytest.mark.slow
def test_bench_cold_tune_runs_its_child(tmp_path):
    # the benchmark's child process imports and tunes (CPU smoke: one candidate, no pool)
    import json
    import subprocess
    res = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_cold_tune", "--out", str(tmp_path),
         "--shape", "2,16,8", "--max-configs", "1", "--workers", "0", "--device", "cpu"],
        capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    (row,) = json.loads((tmp_path / "cold_tune.json").read_text())["rows"]
    assert "error" not in row, row.get("error")
    assert row["ok"] == 1 and row["winner"]
