"""Integer helpers for host-side launch arithmetic.

``triton.cdiv`` and ``triton.next_power_of_2`` are Triton functions usable inside kernels; called
from Python (Triton >= 3.4) each call costs microseconds of wrapper overhead, and a scan launch
computes several of them.  These are the plain-Python equivalents.
"""


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive b."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
