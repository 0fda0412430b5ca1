"""The scan's problem: shape, dtypes and features of one ``samu_tune.scan`` call."""
from __future__ import annotations

import math
from typing import ClassVar, Literal, Optional

import torch
from pydantic import BaseModel, ConfigDict, Field

from samu_tune.problem import _LONG_DTYPE, SHORT_DTYPE, DTypeName, dtype_name


class ScanProblem(BaseModel):
    """The shape, dtypes and features of one scan call.

    ``backward`` is True when gradients will be taken (the "train" measurement mode), False
    for forward-only calls.  ``deterministic`` is set when torch's deterministic mode is on:
    strategies that use float atomics are then ineligible.
    """

    model_config = ConfigDict(frozen=True)
    op: ClassVar[str] = "scan"

    B: int = Field(ge=1)
    L: int = Field(ge=1)
    M: int = Field(ge=1)
    dtype: DTypeName = "bfloat16"
    control_dtype: DTypeName = "float32"
    device: Literal["cuda", "cpu"] = "cuda"
    backward: bool = True
    resets: bool = False
    initial_state: bool = False
    final_state: bool = False
    deterministic: bool = False

    @property
    def mode(self) -> str:
        return "train" if self.backward else "forward"

    def key(self) -> str:
        """Stable string key, e.g. ``B8-L4096-M512-bf16-train-resets``.

        The control dtype appears only when it is not float32; the device is not part of the
        key (the cache keeps one file per device signature).
        """
        parts = [f"B{self.B}", f"L{self.L}", f"M{self.M}", SHORT_DTYPE[self.dtype]]
        if self.control_dtype != "float32":
            parts.append(f"ctl{SHORT_DTYPE[self.control_dtype]}")
        parts.append(self.mode)
        for flag, label in ((self.resets, "resets"), (self.initial_state, "h0"),
                            (self.final_state, "final"), (self.deterministic, "det")):
            if flag:
                parts.append(label)
        return "-".join(parts)

    # few rows of modes over a long sequence (:meth:`narrow`)
    NARROW_MODES: ClassVar[int] = 512
    NARROW_MIN_L: ClassVar[int] = 255 * 64 + 1        # 256 chunks of 64 steps
    NARROW_MIN_M: ClassVar[int] = 96

    def narrow(self) -> bool:
        """Few rows of modes (B M <= 512, M >= 96) over a long sequence (L > 16320: 256 or
        more 64-step chunks): few programs per chunk, each waiting on a long chain of
        predecessors, where the look-back's fastest configs differ (128 modes, one row per
        step, a look-back width of 8: 1.09-1.67x faster than the others' choice at five such
        shapes on an H100 and the H200; at (4, 16384, 256), B M = 1024, the nearest tuned
        entry of this kind, (1, 16384, 256), ran 1.12x / 1.21x the exhaustive best forward /
        train on the H200).  Below 96 modes the tile scan serves either kind."""
        return (self.B * self.M <= self.NARROW_MODES and self.L >= self.NARROW_MIN_L
                and self.M >= self.NARROW_MIN_M)

    def long(self) -> bool:
        """256 or more 64-step chunks (L > 16320) from M = 96, not :meth:`narrow`: each chunk
        waits on a long chain of predecessors, where the look-back walks one row per step
        (its rule), and a tuned entry of a shorter sequence does not carry over (at (4, 16384,
        256) on the H200 the nearest shipped entry, (4, 4096, 512), two rows, ran 1.13x / 1.11x
        the best timed forward / train, the rule's one row 1.00x)."""
        return (self.L >= self.NARROW_MIN_L and self.M >= self.NARROW_MIN_M
                and not self.narrow())

    def feature_key(self) -> str:
        """The key without B, L and M, marked ``-unaligned`` where M is not a multiple of 8,
        ``-narrow`` for :meth:`narrow` problems and ``-long`` for :meth:`long` ones: problems
        that may share a nearest-neighbour choice.  The look-back kernels load rows as vectors
        of 8 elements, which their software pipeline stages, only where M is a multiple of 8,
        so a config tuned at such an M does not carry over to another (at (3, 5000, 300),
        bf16, on the H200 the nearest tuned config, staged, ran 1.30x / 1.43x the best
        forward / train)."""
        return self._aligned_key() + self._chain_mark()

    def _aligned_key(self) -> str:
        return self.key().split("-", 3)[3] + ("" if self.M % 8 == 0 else "-unaligned")

    def _chain_mark(self) -> str:
        return "-narrow" if self.narrow() else "-long" if self.long() else ""

    def prior_features(self) -> tuple[str, ...]:
        """The feature keys whose tuned winners the tuner times first for this problem: its
        own, then the same marked otherwise (plain, ``-narrow``, ``-long``): the kinds are
        served apart, but a winner of one kind is a cheap candidate for another (at (1,
        2048, 1024) train on the H200 grid, priors of its own kind alone picked 1.128x the
        best, with the narrow winners 1.045x, replayed by benchmarks/search_study.py)."""
        own, base = self.feature_key(), self._aligned_key()
        return own, *(base + mark for mark in ("", "-narrow", "-long") if base + mark != own)

    def coords(self) -> tuple[float, float]:
        """(log(B*M), log(L)): the nearest-key search's space."""
        return math.log(self.B * self.M), math.log(self.L)

    @classmethod
    def from_key(cls, key: str, device: str = "cuda") -> "ScanProblem":
        """Inverse of :meth:`key`."""
        parts = key.split("-")
        try:
            B, L, M = (int(p[1:]) for p in parts[:3])
            fields: dict[str, object] = dict(B=B, L=L, M=M, dtype=_LONG_DTYPE[parts[3]],
                                             device=device)
            for part in parts[4:]:
                if part.startswith("ctl"):
                    fields["control_dtype"] = _LONG_DTYPE[part[3:]]
                elif part in ("train", "forward"):
                    fields["backward"] = part == "train"
                else:
                    fields[{"resets": "resets", "h0": "initial_state", "final": "final_state",
                            "det": "deterministic"}[part]] = True
        except (KeyError, ValueError, IndexError):
            raise ValueError(f"not a problem key: {key!r}") from None
        return cls(**fields)

    @property
    def elements(self) -> int:
        return self.B * self.L * self.M

    @classmethod
    def from_tensors(
        cls, eta: torch.Tensor, br: torch.Tensor, *, segment_pos: Optional[torch.Tensor] = None,
        initial_state: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
        output_final_state: bool = False, backward: Optional[bool] = None,
        tensors: tuple[torch.Tensor, ...] = (),
    ) -> "ScanProblem":
        """Build the problem of a validated call.

        ``backward`` defaults to: grad mode is on and one of ``tensors`` requires grad.
        """
        if backward is None:
            backward = torch.is_grad_enabled() and any(
                t is not None and t.requires_grad for t in tensors)
        B, L, M = br.shape
        return cls(
            B=B, L=L, M=M, dtype=dtype_name(br.dtype), control_dtype=dtype_name(eta.dtype),
            device="cuda" if br.device.type == "cuda" else "cpu", backward=bool(backward),
            resets=segment_pos is not None, initial_state=initial_state is not None,
            final_state=bool(output_final_state),
            deterministic=torch.are_deterministic_algorithms_enabled(),
        )
