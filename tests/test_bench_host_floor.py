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
    assert len(pairs) == 4 and len(rows) == 13
    assert not any("error" in r for r in rows if "full" not in r)
    for r in pairs:
        assert "error" not in r["full"] and "error" not in r["stubbed"], r
        # the interpreter runs every kernel on the CPU: its launches dominate a call
        assert r["stubbed"]["host_ms"] < r["full"]["host_ms"], r
        # the outputs' allocations at least (the decode step writes into its loop's buffers)
        assert r["ops"] >= (0 if r["case"].startswith("decode") else 2), r
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
    assert train["autograd.backward"]["us"] >= train["lookback._LookbackScan.backward"]["us"]
    assert "lookback._LookbackScan.backward" not in sections["scan forward (1, 32, 16)"]["sections"]
    # the real launches run inside _launch (the interpreter's: far slower than stubbed)
    real = sections["scan forward+backward (1, 32, 16)"]["sections"]
    assert real["lookback._launch"]["us"] > train["lookback._launch"]["us"]
    assert all(r["timer_us"] >= 0 for r in sections.values())
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


def test_timer_cost_is_measured_and_the_probe_restored():
    from benchmarks import host_sections
    before = host_sections._Probe.__dict__["fn"]
    cost = host_sections.timer_cost_us(200)
    assert 0.0 <= cost < 1000.0
    assert host_sections._Probe.__dict__["fn"] is before


def test_launch_counts_name_each_launched_kernel():
    """After a scan, the look-back kernel's wrapper reports its launches; under the
    interpreter all of them go through kernel[grid], and the reason says why."""
    import samu_tune
    from benchmarks.host_floor import launch_counts
    x = torch.randn(1, 16, 8)
    samu_tune.scan(torch.randn(1, 16), torch.randn(1, 16), torch.randn(8), torch.randn(8), x,
                   torch.randn_like(x), strategy="lookback")
    rows = {r["kernel"]: r for r in launch_counts()}
    row = rows["lookback_scan"]
    assert row["direct"] == 0 and row["normal"] >= 1
    assert row["reason"] == "TRITON_INTERPRET=1"
