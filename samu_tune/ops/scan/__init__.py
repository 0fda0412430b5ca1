"""The SAMU scan: ``samu_tune.scan`` (:mod:`.api`), its problem, spec, reference and strategies."""
