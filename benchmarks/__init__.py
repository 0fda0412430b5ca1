"""What a user or reviewer reruns to measure samu_tune, each a module run from the repository
root (``python -m benchmarks.<name> --help``); most need a CUDA GPU (``tools/gpu_run.sh`` runs
them on the device machine, one phase each).

- ``bench_scan``: every strategy, ``samu_tune.scan``, the seed and accelerated-scan on the
  benchmark grid (the README's Performance tables; ``tools/ship_defaults.py`` builds the
  shipped table from its ``bench.json``); ``bench_report``: its tables and chart.
- ``bench_host``: GPU time, host time per call and eager wall of the scan, layer, decode step
  and a four-block model, eager and compiled (the README's "A user's time").
- ``bench_layer``: the SAMU layer (fused, unfused, on the seed's scan) and the decode step.
- ``bench_tuner``: the tuner's pick and wall time against an exhaustive search;
  ``bench_cold_tune``: a cold tune with and without the compile pool.
- ``search_study``: a short search (priors, then defaults) replayed on a ``bench.json``'s
  measured times (no GPU).
- ``bench_lookback``: look-back configs against ``serial`` (the look-back defaults);
  ``bench_fused_configs``: the fused layer at explicit look-back configs.
- ``dispatch_overhead``: what a cache hit adds to a ``samu_tune.scan`` call (CPU or GPU).
- ``common``: what they (and ``tools/``) share.  ``results/``: the measurements behind the
  shipped tables and the README's tables.

Kept out of the ``samu_tune`` distribution (``pyproject.toml`` packages ``samu_tune*`` only).
"""
