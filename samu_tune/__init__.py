"""samu_tune: autotuned GPU scan strategies for the SAMU complex diagonal recurrence.

``samu_tune.scan(eta, delta, nu_log, theta_log, br, bi, ...)`` dispatches to the fastest
registered strategy for the problem and GPU; ``samu_tune.tune(problem)`` measures it;
``samu_tune.cache`` holds the winners; ``samu_tune.explain(...)`` says what dispatch does.
"""
__version__ = "0.1.0"

from samu_tune import cache  # noqa: E402
from samu_tune.ops.layer import SAMU, varlen_scan  # noqa: E402
from samu_tune.ops.linear import complex_scan, real_scan  # noqa: E402
from samu_tune.dispatch import Decision, NoEligibleStrategy, choose, resolve  # noqa: E402
from samu_tune.explanation import Explanation  # noqa: E402
from samu_tune.ops.scan.api import explain, scan  # noqa: E402
from samu_tune.ops.decode.problem import DecodeProblem  # noqa: E402
from samu_tune.ops.scan.problem import ScanProblem  # noqa: E402
from samu_tune.ops.scan.reference import scan_reference  # noqa: E402
from samu_tune.ops.scan.capability import Capability  # noqa: E402
from samu_tune.registry import Strategy, all_strategies, eligible, get, register  # noqa: E402
from samu_tune.rules import rule_choice  # noqa: E402
from samu_tune.ops.scan.tensors import ScanInputs, ScanOutput  # noqa: E402
from samu_tune.results import Candidate, TuneEvent, TuneResult  # noqa: E402
from samu_tune.tuner import tune  # noqa: E402
from samu_tune import opspec as _opspec  # noqa: E402
from samu_tune.settings import settings as _settings  # noqa: E402

_opspec.load_builtin()   # every op's strategies and samu_tune::* operators, before any trace
_settings()   # read the environment now: torch.compile traces a read of it, not its parsing

__all__ = [
    "scan", "resolve", "choose", "explain", "Decision", "Explanation", "NoEligibleStrategy",
    "tune", "TuneResult", "TuneEvent", "Candidate", "cache", "rule_choice",
    "ScanProblem", "DecodeProblem", "scan_reference", "Capability", "Strategy", "all_strategies", "eligible",
    "get", "register", "ScanInputs", "ScanOutput", "__version__",
    "SAMU", "real_scan", "complex_scan", "varlen_scan",
]
