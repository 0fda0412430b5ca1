"""The scan strategies' capability model: what a strategy can run, as data."""
from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict

from samu_tune.device import DeviceInfo
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.registry import device_reasons
from samu_tune.settings import settings

ALL_DTYPES = frozenset({"float32", "bfloat16", "float16"})
CONTROL_DTYPES = frozenset({"float32", "bfloat16"})


class Capability(BaseModel):
    """What a strategy can run, as data; :meth:`reasons` says in words why it cannot."""

    model_config = ConfigDict(frozen=True)

    dtypes: frozenset[str] = ALL_DTYPES
    control_dtypes: frozenset[str] = CONTROL_DTYPES
    devices: frozenset[str] = frozenset({"cuda"})
    triton: bool = True            # Triton kernels: CPU tensors only under TRITON_INTERPRET=1
    max_modes: Optional[int] = None
    max_length: Optional[int] = None
    resets: bool = True
    initial_state: bool = True
    final_state: bool = True
    backward: bool = True
    deterministic: bool = True     # no float atomics: bitwise reproducible
    min_compute_capability: Optional[tuple[int, int]] = None
    interpreter: bool = True       # runs under TRITON_INTERPRET=1 (Gluon kernels do not)
    modes_multiple: int = 1        # M a multiple of it (rows copied as 16-byte vectors)

    def reasons(self, problem: ScanProblem, device: Optional[DeviceInfo] = None) -> list[str]:
        """Why this capability cannot run ``problem`` on ``device``; empty when it can."""
        out: list[str] = []
        if problem.dtype not in self.dtypes:
            out.append(f"dtype {problem.dtype} not in {sorted(self.dtypes)}")
        if problem.control_dtype not in self.control_dtypes:
            out.append(f"control dtype {problem.control_dtype} not in {sorted(self.control_dtypes)}")
        out += device_reasons(problem.device, self.devices, self.triton, device)
        if not self.interpreter and (problem.device == "cpu" or settings().interpret):
            out.append("Gluon kernel: not under the Triton interpreter (TRITON_INTERPRET=1)")
        if self.max_modes is not None and problem.M > self.max_modes:
            out.append(f"M={problem.M} > max_modes={self.max_modes}")
        if problem.M % self.modes_multiple:
            out.append(f"M={problem.M} not a multiple of {self.modes_multiple}")
        if self.max_length is not None and problem.L > self.max_length:
            out.append(f"L={problem.L} > max_length={self.max_length}")
        for wanted, supported, label in (
            (problem.resets, self.resets, "resets (segment_pos)"),
            (problem.initial_state, self.initial_state, "initial state"),
            (problem.final_state, self.final_state, "final state"),
            (problem.backward, self.backward, "backward"),
        ):
            if wanted and not supported:
                out.append(f"no {label}")
        if problem.deterministic and not self.deterministic:
            out.append("not deterministic (float atomics) while deterministic mode is on")
        if (self.min_compute_capability is not None and device is not None
                and device.kind == "cuda" and device.capability is not None
                and device.capability < self.min_compute_capability):
            need = "%d.%d" % self.min_compute_capability
            have = "%d.%d" % device.capability
            out.append(f"compute capability {have} < {need}")
        return out
