"""Compiler options every kernel launch passes beside its grid, ``num_warps`` and constexprs.

``enable_fp_fusion``: multiply-add contraction on, stated rather than left to Triton's
default: Triton 3.9 warns at every first compile where a launch leaves it unset and its
default turns off in 3.10, while the kernels' complex products are written to contract
into fused multiply-adds (:func:`samu_tune.kernels.complex_math.cmul_add`).  The same value
as Triton 3.6's and 3.9's default, so the binaries those builds produce are unchanged.
"""

LAUNCH_OPTIONS = {"enable_fp_fusion": True}
