"""One rank of the distributed dispatch test (run as a script by tests/test_dispatch.py).

Each rank has its own cache dir: rank 0's holds an exact entry choosing ``fake_b``; rank 1's
is empty, so on its own it would take the rule choice ``fake_a`` (the highest priority).  With the
broadcast, both must run ``fake_b``.
"""
import json
import os
import sys


def main(rank: int, world: int, init_file: str, root: str) -> None:
    os.environ["SAMU_TUNE_CACHE_DIR"] = os.path.join(root, f"rank{rank}")
    os.environ["TRITON_INTERPRET"] = "1"
    import torch.distributed as dist

    from samu_tune import cache, dispatch, registry
    from samu_tune.ops.scan.api import scan
    from samu_tune.ops.scan.problem import ScanProblem
    from samu_tune.ops.scan.capability import Capability
    from samu_tune.registry import Strategy
    from samu_tune.ops.scan.strategies import reference
    from samu_tune.ops.scan.verify import random_inputs

    calls = []

    def make(name, priority):
        def run(inputs, cfg):
            calls.append(name)
            return reference.run(inputs, cfg)
        return Strategy(name=name, description=name, run=run, priority=priority,
                        capability=Capability(devices=frozenset({"cpu", "cuda"}), triton=False))
    registry.register(make("fake_a", 1000))
    registry.register(make("fake_b", 0))
    problem = ScanProblem(B=2, L=5, M=3, dtype="float32", device="cpu", backward=False)
    if rank == 0:
        cache.put(cache.CacheEntry(
            key=problem.key(), mode="forward", strategy="fake_b", config={}, time_ms=1.0,
            source_hash=registry.get("fake_b").source_hash, measured_at="2026",
            cpu_wall_time=True, versions=cache.versions()), "cpu-interpreter")
    local = dispatch.choose(problem).strategy.name
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    inp = random_inputs(problem, seed=0)
    for _ in range(3):  # the first call broadcasts, the others hit the memo
        scan(inp.eta, inp.delta, inp.nu_log, inp.theta_log, inp.br, inp.bi)
    dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(root, f"out{rank}.json"), "w") as f:
        json.dump({"local": local, "calls": calls}, f)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
