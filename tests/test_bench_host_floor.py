"""The host-floor part of benchmarks/bench_host.py on the CPU (interpreter, tiny shapes)."""
import pytest
import torch

from benchmarks.bench_host import CpuClock, Plan, fmt
import samu_tune
from benchmarks.host_floor import floor_markdown, launches_stubbed, run_floor
from benchmarks.host_sections import sections_markdown
from samu_tune import launcher
from triton.runtime.jit import JITFunction

# the interpreter's launches on CPU tensors (on a CUDA machine the benchmark itself runs)
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter test")


def test_stubbing_restores_launches():
    before = (JITFunction.__getitem__, launcher.FastKernel.__getitem__,
              launcher.FastKernel.launch)
    with launches_stubbed():
        assert launcher.FastKernel.launch is not before[2]
        assert JITFunction.__getitem__ is not before[0]
    assert (JITFunction.__getitem__, launcher.FastKernel.__getitem__,
            launcher.FastKernel.launch) == before


def test_floor_rows_and_table():
    out: dict = {}
    run_floor(Plan(quick=False, smoke=True), CpuClock(), torch.device("cpu"), out,
              lambda: None)
    rows = out["floor"]
    pairs = [r for r in rows if "full" in r]
    assert len(pairs) == 5 and len(rows) == 16
    assert not any("error" in r for r in rows if "full" not in r)
    cases = {r["case"] for r in rows}
    assert {"the same, engine on the calling thread",
            "4 such Functions chained, one backward (per 4)",
            "scan forward+backward (1, 32, 16), engine on the calling thread"} <= cases
    for r in pairs:
        assert "error" not in r["full"] and "error" not in r["stubbed"], r
        # the interpreter runs every kernel on the CPU: its launches dominate a call
        assert r["stubbed"]["host_ms"] < r["full"]["host_ms"], r
        # the outputs' allocations at least (the decode step writes into its loop's buffers)
        if not r["case"].startswith("decode"):
            assert r["ops"] >= 2, r
    table = "\n".join(floor_markdown(rows, fmt))
    assert "| scan forward (1, 32, 16) |" in table and "the launches" in table
    # the scan calls by section: the outermost and the strategy's node timed, once per call
    sections = {r["case"]: r for r in out["floor_sections"]}
    assert set(sections) == {f"scan {c} (1, 32, 16){s}" for c in ("forward", "forward+backward")
                             for s in ("", " (stubbed)")}
    assert all("error" not in r for r in sections.values()), sections
    train = sections["scan forward+backward (1, 32, 16) (stubbed)"]["sections"]
    assert train["samu_tune.scan"]["calls"] == 1.0
    assert train["lookback._LookbackScan.backward"]["calls"] == 1.0
    backward = train["torch.autograd.backward"]
    assert backward["us"] >= train["lookback._LookbackScan.backward"]["us"]
    assert "lookback._LookbackScan.backward" not in sections["scan forward (1, 32, 16)"]["sections"]
    # the real launches run inside _launch (the interpreter's: far slower than stubbed)
    real = sections["scan forward+backward (1, 32, 16)"]["sections"]
    assert real["lookback._launch"]["us"] > train["lookback._launch"]["us"]
    assert all(r["plain_us"] > 0 and r["timer_us"] is not None for r in sections.values())
    text = "\n".join(sections_markdown(out["floor_sections"], fmt))
    assert "| samu_tune.scan |" in text


def test_timers_are_removed_after_the_block():
    from benchmarks.host_sections import timed
    from samu_tune.ops.scan.strategies import lookback as lb
    before = (samu_tune.scan, lb._LookbackScan.__dict__["forward"], lb._launch)
    with timed():
        assert samu_tune.scan is not before[0]
        assert isinstance(lb._LookbackScan.__dict__["forward"], staticmethod)
    assert (samu_tune.scan, lb._LookbackScan.__dict__["forward"], lb._launch) == before


def test_timers_are_removed_after_an_error_and_inherited_methods_restored():
    from benchmarks.host_sections import timed

    class Base:
        @classmethod
        def who(cls):
            return cls.__name__

    class Child(Base):
        pass

    import sys
    module = type(sys)("fake_sections_module")
    module.Child = Child
    sys.modules["fake_sections_module"] = module
    try:
        with pytest.raises(RuntimeError):
            with timed((("fake_sections_module", "Child.who"),)) as acc:
                assert Child.who() == "Child"          # a classmethod still bound to Child
                raise RuntimeError
        assert acc["fake_sections_module.Child.who"][1] == 1
        assert "who" not in vars(Child) and Child.who() == "Child"
    finally:
        del sys.modules["fake_sections_module"]


class _Retrying:
    """A clock whose measurement behind the busy-wait runs its calls twice (a retry)."""

    def sync(self):
        pass

    def wall(self, call, n, rounds):
        return {"wall_ms": 0.01}

    def behind_sleep(self, call, n, estimate_ms):
        for _ in range(2 * n):
            call()
        return {"host_ms": 0.01}


def test_sections_count_every_call_of_a_retried_measurement():
    from benchmarks.bench_host import scan_call, scan_inputs
    from benchmarks.host_sections import section_times
    call = scan_call(scan_inputs((1, 32, 16), torch.device("cpu")), False)
    with launches_stubbed():
        row = section_times(call, 3, _Retrying(), warmup=1)
    assert row["sections"]["samu_tune.scan"]["calls"] == 1.0
