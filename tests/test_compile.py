"""Real launches compile for sm_90 with the installed Triton, not only run in the interpreter.

The interpreter executes kernels as Python: it accepts code Triton's compiler rejects (a None
returned in a tuple, mismatched return types), which then fails on every GPU.  Here the
look-back scan's loop walks (one and two rows, with and without resets, h0 and final state,
forward and backward, both addressings) and the fused SAMU layer run on tiny problems with
every launch recorded (``tools/compile_check.py``), and a child process without the
interpreter compiles each recorded launch through Triton's NVIDIA backend and ptxas.
"""
import json
import re
import os
import subprocess
import sys
from pathlib import Path

import torch

import samu_tune
from samu_tune.ops.scan.strategies import lookback as lb
from samu_tune.ops.scan.strategies.lookback import LookbackConfig, LookbackPlan
from samu_tune.ops.scan.verify import random_inputs

from _helpers import cpu_problem
from tools import compile_check

ROOT = Path(__file__).resolve().parents[1]


def _scan(plan, problem, seed):
    inputs = random_inputs(problem, seed=seed)
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs.differentiable()]
    names = ("eta", "delta", "nu_log", "theta_log", "br", "bi")
    fields = dict(zip(names, leaves))
    if problem.initial_state:
        fields["initial_state"] = (leaves[6], leaves[7])
    out = lb.lookback_scan(inputs.replace(**fields), plan)
    loss = out.real.float().sum() + out.imag.float().sum()
    if out.final_state is not None:
        loss = loss + out.final_state[0].sum()
    loss.backward()


def test_recorded_launches_compile(tmp_path, monkeypatch):
    seen: dict = {}
    loop = LookbackConfig(chunk=16, block_m=16, num_warps=2, inner="loop")
    with compile_check.recording(seen):
        for rows in (1, 2):
            for rebase in (True, False):
                monkeypatch.setattr(LookbackPlan, "rebase", lambda self, reverse, r=rebase: r)
                plan = LookbackPlan.of(loop.model_copy(update={"rows": rows}))
                _scan(plan, cpu_problem(2, 37, 16, dtype="bfloat16"), seed=rows)
                _scan(plan, cpu_problem(2, 37, 16, dtype="bfloat16", resets=True,
                                        initial_state=True, final_state=True), seed=rows + 2)
        monkeypatch.undo()
        layer = samu_tune.SAMU(72, strategy="fused")
        y, _ = layer(torch.randn(2, 24, 144).to(torch.bfloat16).requires_grad_())
        y.float().sum().backward()
    launches = list(seen.values())
    names = {launch["name"] for launch in launches}
    assert {"lookback_scan", "controller_forward",
            "controller_backward"} <= names, names
    path = tmp_path / "launches.json"
    path.write_text(json.dumps(launches))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-m", "tools.compile_check", "--launches", str(path)],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    # the recorded launches and the Gluon kernels' (compile_check.gluon_launches)
    failed = re.search(r"(\d+) of (\d+) failed", res.stdout)
    assert failed and failed.group(1) == "0", res.stdout[-3000:]
    assert int(failed.group(2)) >= len(launches) + len(compile_check.gluon_launches(False))
