"""The SAMU layer's problem: the scan's fields, keys prefixed ``layer:``."""
from __future__ import annotations

from typing import ClassVar

from samu_tune.ops.scan.problem import ScanProblem


class LayerProblem(ScanProblem):
    """One SAMU layer call (:class:`samu_tune.SAMU`): x [B, L, 2M] in ``dtype`` -> y [B, L, 2M]
    and the final state, forward or forward + backward (``backward``), with resets
    (``segment_pos``) and an initial state or not.  The fields are the scan's (the layer's
    scan is that problem with ``final_state``; the controls are fp32), the key is the scan key
    prefixed ``layer:``, e.g. ``layer:B8-L4096-M512-bf16-train``."""

    op: ClassVar[str] = "layer"

    def key(self) -> str:
        return f"{self.op}:" + super().key()

    def feature_key(self) -> str:
        return f"{self.op}:" + super().key().split("-", 3)[3]

    @classmethod
    def from_key(cls, key: str, device: str = "cuda") -> "LayerProblem":
        """Inverse of :meth:`key`."""
        op, sep, rest = key.partition(":")
        if op != cls.op or not sep:
            raise ValueError(f"not a layer problem key: {key!r}")
        return super().from_key(rest, device)
