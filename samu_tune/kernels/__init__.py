"""``@triton.jit`` code only: no torch, no launches."""
