"""Problem keys, registry and capability reasons, input validation, scan end to end."""
import subprocess
import sys

import pytest
import torch
from pydantic import BaseModel, ConfigDict
from typing import Literal

import samu_tune
from samu_tune import registry
from samu_tune.device import DeviceInfo
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.reference import scan_reference
from samu_tune.ops.scan.capability import Capability
from samu_tune.registry import Strategy, config_space
from samu_tune.ops.scan.tensors import ScanOutput
from samu_tune.ops.scan.verify import random_inputs, verify


# ---- problem keys -----------------------------------------------------------------------

def test_problem_key_reads_like_the_design():
    p = ScanProblem(B=8, L=4096, M=512, dtype="bfloat16", backward=True, resets=True)
    assert p.key() == "B8-L4096-M512-bf16-train-resets"
    q = ScanProblem(B=1, L=7, M=3, dtype="float32", control_dtype="bfloat16", backward=False,
                    initial_state=True, final_state=True, deterministic=True)
    assert q.key() == "B1-L7-M3-f32-ctlbf16-forward-h0-final-det"
    for prob in (p, q):
        assert ScanProblem.from_key(prob.key(), device=prob.device) == prob
    assert p.feature_key() == "bf16-train-resets"


def test_problem_from_tensors_reads_features():
    inp = random_inputs(ScanProblem(B=2, L=3, M=4, dtype="float16", device="cpu",
                                    resets=True, initial_state=True), seed=0)
    p = ScanProblem.from_tensors(inp.eta, inp.br, segment_pos=inp.segment_pos,
                                 initial_state=inp.initial_state, output_final_state=True,
                                 tensors=(inp.br.requires_grad_(True),))
    assert (p.B, p.L, p.M, p.dtype, p.backward, p.resets, p.initial_state, p.final_state) == (
        2, 3, 4, "float16", True, True, True, True)
    with torch.no_grad():
        p2 = ScanProblem.from_tensors(inp.eta, inp.br, tensors=(inp.br,))
    assert not p2.backward and p2.key() == "B2-L3-M4-f16-forward"


@pytest.mark.parametrize("bad", ["B0-L1-M1-f32-train", "nonsense", "B1-L1-M1-f32-train-xyz"])
def test_problem_from_bad_key(bad):
    with pytest.raises(ValueError):
        ScanProblem.from_key(bad)


# ---- registry ---------------------------------------------------------------------------

class ToyConfig(BaseModel):
    model_config = ConfigDict(frozen=True)
    block: Literal[16, 32]
    fast: bool


def _toy(name="toy", **cap):
    return Strategy(name=name, description="toy", run=lambda inp, cfg: ScanOutput(inp.br, inp.bi),
                    capability=Capability(**cap), config_model=ToyConfig,
                    valid=lambda p, cfg: not (cfg.fast and p.M < 4))


def test_config_space_is_the_product_of_literals():
    space = config_space(ToyConfig)
    assert len(space) == 4 and len(set(space)) == 4
    assert ToyConfig(block=16, fast=True) in space


def test_registering_a_toy_strategy_makes_it_eligible_with_reasons():
    toy = _toy(max_modes=64, resets=False, deterministic=False, devices=frozenset({"cuda"}),
               min_compute_capability=(9, 0))
    registry.register(toy)
    try:
        gpu = DeviceInfo(kind="cuda", name="X", capability=(8, 0), sm_count=10)
        h100 = DeviceInfo(kind="cuda", name="H", capability=(9, 0), sm_count=132)
        ok = ScanProblem(B=1, L=8, M=32)
        reasons = dict((s.name, r) for s, r in registry.eligible(ok, h100))
        assert reasons["toy"] == []
        bad = ScanProblem(B=1, L=8, M=128, resets=True, deterministic=True)
        r = dict((s.name, r) for s, r in registry.eligible(bad, gpu))["toy"]
        assert "M=128 > max_modes=64" in r
        assert "no resets (segment_pos)" in r
        assert any("deterministic" in x for x in r)
        assert "compute capability 8.0 < 9.0" in r
        cpu = ScanProblem(B=1, L=8, M=32, device="cpu")
        r = dict((s.name, r) for s, r in registry.eligible(cpu, DeviceInfo(kind="cpu", name="cpu")))
        assert r["toy"] == ["CPU tensors need TRITON_INTERPRET=1 for Triton kernels"]
        # valid() prunes the space; no valid config is itself a reason
        assert len(toy.configs(ScanProblem(B=1, L=8, M=2))) == 2
        assert registry.get("toy") is toy
        with pytest.raises(ValueError, match="already registered"):
            registry.register(_toy())
    finally:
        registry.unregister("toy")
    with pytest.raises(ValueError, match="unknown strategy 'toy'"):
        registry.get("toy")


def test_source_hash_is_stable_and_distinct():
    ref = registry.get("reference")
    assert ref.source_hash == ref.source_hash and len(ref.source_hash) == 16
    assert _toy("a").source_hash != _toy("b").source_hash


def test_no_eligible_strategy_lists_every_strategy(monkeypatch):
    inp = random_inputs(ScanProblem(B=1, L=3, M=70, device="cpu", dtype="float32"), seed=0)
    registry.all_strategies()  # built-ins imported before the registry is swapped
    monkeypatch.setattr(registry, "_REGISTRY", {
        "small": _toy("small", max_modes=64), "fwd": _toy("fwd", backward=False, dtypes={"float16"})})
    with pytest.raises(samu_tune.NoEligibleStrategy) as info:
        samu_tune.scan(inp.eta, inp.delta, inp.nu_log, inp.theta_log, inp.br.requires_grad_(True),
                       inp.bi)
    msg = str(info.value)
    assert "B1-L3-M70-f32-train" in msg
    assert "small: M=70 > max_modes=64" in msg
    assert "fwd: dtype float32 not in ['float16']; no backward" in msg
    with pytest.raises(samu_tune.NoEligibleStrategy, match="strategy 'small' cannot run"):
        samu_tune.scan(inp.eta, inp.delta, inp.nu_log, inp.theta_log, inp.br, inp.bi,
                       strategy="small")


# ---- validation -------------------------------------------------------------------------

def _args(B=2, L=5, M=3):
    inp = random_inputs(ScanProblem(B=B, L=L, M=M, device="cpu", dtype="float32"), seed=0)
    return dict(eta=inp.eta, delta=inp.delta, nu_log=inp.nu_log, theta_log=inp.theta_log,
                br=inp.br, bi=inp.bi)


BAD = [
    ("br", lambda a: a["br"][0], ValueError, "br must have shape"),
    ("bi", lambda a: a["bi"][:, :, :2], ValueError, r"bi must have shape \[B, L, M\]"),
    ("eta", lambda a: a["eta"][:, :4], ValueError, r"eta must have shape \[B, L\] = \[2, 5\]"),
    ("delta", lambda a: a["delta"].T, ValueError, "delta must have shape"),
    ("nu_log", lambda a: a["nu_log"][:2], ValueError, r"nu_log must have shape \[M\] = \[3\]"),
    ("theta_log", lambda a: a["theta_log"][None], ValueError, "theta_log must have shape"),
    ("br", lambda a: a["br"].to(torch.int32), TypeError, "br must have dtype"),
    ("bi", lambda a: a["bi"].half(), TypeError, "bi must have br's dtype"),
    ("eta", lambda a: a["eta"].half(), TypeError, "eta must have dtype"),
    ("delta", lambda a: a["delta"].double(), TypeError, "delta must have eta's dtype"),
    ("nu_log", lambda a: a["nu_log"].bfloat16(), TypeError, "nu_log must have dtype"),
    ("eta", lambda a: a["eta"].tolist(), TypeError, "eta must be a torch.Tensor"),
    ("br", lambda a: a["br"].to("meta"), ValueError, "one device"),
]


@pytest.mark.parametrize("arg,mutate,exc,msg", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_names_the_argument(arg, mutate, exc, msg):
    a = _args()
    a[arg] = mutate(a)
    if arg == "br" and exc is ValueError and "device" not in msg:
        a["bi"] = a["br"]
    with pytest.raises(exc, match=msg):
        samu_tune.scan(**a)


def test_empty_length_runs_and_bad_state_and_segments_raise():
    a = _args(L=1)
    for k in ("eta", "delta"):
        a[k] = a[k][:, :0]
    for k in ("br", "bi"):
        a[k] = a[k][:, :0]
    out = samu_tune.scan(**a, output_final_state=True)          # tests/test_empty.py: more
    assert out.real.shape == a["br"].shape and not out.final_state[0].any()
    a = _args()
    with pytest.raises(ValueError, match=r"initial_state\[1\] must have shape \[B, M\]"):
        samu_tune.scan(**a, initial_state=(torch.zeros(2, 3), torch.zeros(3, 2)))
    with pytest.raises(TypeError, match="initial_state must be a pair"):
        samu_tune.scan(**a, initial_state=torch.zeros(2, 3))
    with pytest.raises(TypeError, match="segment_pos must have an integer dtype"):
        samu_tune.scan(**a, segment_pos=torch.zeros(2, 5))
    with pytest.raises(TypeError, match="output_final_state must be a bool, got str 'no'"):
        samu_tune.scan(**a, output_final_state="no")
    with pytest.raises(ValueError, match="got meta tensors"):
        samu_tune.scan(**{k: v.to("meta") for k, v in a.items()})
    with pytest.raises(ValueError, match=r"segment_pos must have shape \[B, L\]"):
        samu_tune.scan(**a, segment_pos=torch.zeros(2, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="unknown strategy"):
        samu_tune.scan(**a, strategy="nope")


# ---- scan end to end --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_scan_on_cpu_matches_reference_with_everything(dtype):
    p = ScanProblem(B=2, L=9, M=4, dtype=dtype, control_dtype=dtype, device="cpu",
                    resets=True, initial_state=True, final_state=True)
    inp = random_inputs(p, seed=4)

    def run(i):
        return samu_tune.scan(i.eta, i.delta, i.nu_log, i.theta_log, i.br, i.bi,
                              initial_state=i.initial_state, segment_pos=i.segment_pos,
                              output_final_state=True)
    assert verify(run, inp, p) is None
    out = run(inp)
    assert isinstance(out, samu_tune.ScanOutput) and out.final_state is not None
    out2 = samu_tune.scan(inp.eta, inp.delta, inp.nu_log, inp.theta_log, inp.br, inp.bi)
    assert out2.final_state is None


def test_verify_catches_a_wrong_strategy():
    p = ScanProblem(B=1, L=6, M=3, dtype="float32", device="cpu", final_state=True)
    inp = random_inputs(p, seed=2)

    def off_by_a_bit(i):
        out = scan_reference(i.eta, i.delta, i.nu_log, i.theta_log, i.br, i.bi,
                             output_final_state=True)
        return ScanOutput(out.real * 1.01, out.imag, out.final_state)
    assert "real: relative error" in verify(off_by_a_bit, inp, p)

    def wrong_gradient(i):
        out = scan_reference(i.eta, i.delta.detach(), i.nu_log, i.theta_log, i.br, i.bi,
                             output_final_state=True)
        return out
    assert "grad_delta" in verify(wrong_gradient, inp, p)


def test_cli_help_runs():
    res = subprocess.run([sys.executable, "-m", "samu_tune.cli", "--help"], capture_output=True,
                         text=True)
    assert res.returncode == 0 and "samu-tune" in res.stdout


def test_environment_block_puts_back_what_was_there(monkeypatch):
    import os
    from samu_tune.settings import environment
    monkeypatch.setenv("SAMU_TUNE_MODE", "off")
    monkeypatch.delenv("SAMU_TUNE_VERBOSE", raising=False)
    with pytest.raises(RuntimeError):
        with environment(SAMU_TUNE_MODE="cached", SAMU_TUNE_VERBOSE="1"):
            assert (os.environ["SAMU_TUNE_MODE"], os.environ["SAMU_TUNE_VERBOSE"]) == (
                "cached", "1")
            raise RuntimeError
    assert os.environ["SAMU_TUNE_MODE"] == "off" and "SAMU_TUNE_VERBOSE" not in os.environ
