"""The gradient block of the scan's and the fused layer's backward operators.

A backward operator may not return outputs that alias each other, so the look-back's zeroed
gradient accumulators (grad eta, delta [B, L], nu_log, theta_log [M], and gamma [M] for the
fused layer: views of one allocation) would each be copied on the way out, four or five
copy launches per call under ``torch.compile``.  Instead the operator returns them as one
fp32 vector, the block, and the autograd formula around it cuts the views (free in a
compiled graph).  The block is the accumulators' own allocation: :class:`OperatorWork`
zeroes it, accumulators first and the backward's look-back head after them, and hands it to
the strategy's backward in place of the buffers an eager forward zeroed (``ctx.work``).  A
leaf's ``.grad`` taken from the block is a view of it, so the allocation (2 B L + 2-3 M
words and the head: 128 KB at B L = 16384) lives as long as any of those gradients."""
from __future__ import annotations

import math

import torch

from samu_tune.ops.scan.strategies import lookback as lb


def grad_block_layout(B, L, M, fused: bool = False) -> tuple:
    """Word offsets of grad eta, grad delta, grad nu_log, grad theta_log (and grad gamma when
    ``fused``) in a gradient block, then its length; each 16-byte aligned, as the look-back
    lays out its accumulators (B, L, M may be symbolic)."""
    ctl_w, m_w = lb._words16(B * L), lb._words16(M)
    offsets = (0, ctl_w, 2 * ctl_w, 2 * ctl_w + m_w)
    if fused:
        offsets += (2 * ctl_w + 2 * m_w,)
    return (*offsets, 2 * ctl_w + (3 if fused else 2) * m_w)


def _shapes(B, L, M) -> tuple:
    """The shapes and (contiguous) strides of grad eta, delta, nu_log, theta_log, gamma."""
    return (((B, L), (L, 1)), ((B, L), (L, 1)), ((M,), (1,)), ((M,), (1,)), ((M,), (1,)))


def unpacked(block: torch.Tensor, B, L, M, fused: bool = False) -> tuple:
    """The block's gradients as views: grad eta, delta [B, L], nu_log, theta_log [M] (and
    gamma [M] when ``fused``)."""
    *offsets, _ = grad_block_layout(B, L, M, fused)
    return tuple(block.narrow(0, at, math.prod(shape)).view(shape)
                 for at, (shape, _) in zip(offsets, _shapes(B, L, M)))


def packed(grads, B: int, L: int, M: int, fused: bool = False) -> torch.Tensor:
    """A new block holding ``grads`` (grad eta, delta, nu_log, theta_log[, gamma]; a None
    leaves its words zero), for strategies whose gradients are tensors apart.  Zero-filled:
    the padding too, so that an operator's output is the same on every call."""
    *offsets, total = grad_block_layout(B, L, M, fused)
    like = next(g for g in grads if g is not None)
    block = like.new_zeros(total, dtype=torch.float32)
    for g, at in zip(grads, offsets):
        if g is not None:
            block[at:at + g.numel()].copy_(g.reshape(-1))
    return block


class OperatorWork:
    """An operator backward's zeroed buffers, as the look-back's backward takes them from
    ``ctx.work`` (:func:`samu_tune.ops.scan.strategies.lookback._backward_work`): the
    accumulators at the start of one int32 allocation and the look-back head after them.
    ``block`` is the accumulators as one fp32 vector from the allocation's start."""

    def __init__(self, plan: "lb.LookbackPlan", B: int, L: int, M: int,
                 device: torch.device, fused: bool = False) -> None:
        *_, acc = grad_block_layout(B, L, M, fused)
        self.zeroed = torch.zeros(acc + lb._head_words(B, L, M, plan), dtype=torch.int32,
                                  device=device)
        self.acc = acc
        self.block = self.zeroed.view(torch.float32).as_strided((acc,), (1,), 0)

    @staticmethod
    def serves(plan) -> bool:
        """Whether a backward of ``plan`` accumulates into zeroed buffers (a decoupled
        look-back): only then are the block's words its gradients."""
        return isinstance(plan, lb.LookbackPlan) and plan.atomic

    def for_backward(self, plan, B: int, L: int, M: int, device: torch.device,
                     fused: bool = False) -> "lb._Backward":
        out = lb._Backward(self.zeroed[self.acc:])
        # one as_strided per view (the traced formula's unpacked takes two ops per view); the
        # block starts its storage, so its offsets are storage offsets
        *offsets, _ = grad_block_layout(B, L, M, fused)
        views = tuple(self.block.as_strided(shape, stride, at)
                      for at, (shape, stride) in zip(offsets, _shapes(B, L, M)))
        out.g_ctl, out.g_spec = views[:2], views[2:4]
        if fused:
            out.g_gamma = views[4]
        return out
