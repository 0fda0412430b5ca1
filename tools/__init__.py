"""Device and compile tooling, each a module run from the repository root
(``python -m tools.<name> --help``).

- ``gpu_run.sh``: the one GPU run script (tests and benchmarks in phases, one device call);
  ``_device_env.sh`` its environment, ``gpu_wheels.sh`` the wheels it carries.
- ``compile_check``: every kernel launch the library makes compiled for sm_90 without a GPU
  (registers, spills, failures); ``chunk_compile_check`` and ``lookback_registers``: the chunk
  family's and the look-back kernel's binaries per config.
- ``ncu_lookback``: the Nsight Compute driver of the look-back kernel.
- ``ship_defaults``: a shipped winner table from a grid run's ``bench.json``;
  ``tune_decode``: the decode step tuned by batch size (its winners are in the shipped table).

Kept out of the ``samu_tune`` distribution (``pyproject.toml`` packages ``samu_tune*`` only).
"""
