"""Strategies as data: capability specs, config spaces, and the registry.

A strategy module builds one :class:`Strategy` and calls :func:`register`.  Everything else
(dispatch, tuner, CLI, the generated tests) reads the registry.

Each strategy serves one op (``Strategy.op``: ``"scan"`` unless set, ``"decode"``, ...);
:func:`eligible` and :func:`all_strategies` list one op's strategies (``problem.op``), so
names need only be unique within an op.  The registry key of a scan strategy is its bare name
(as before ops existed); any other op's is ``"<op>:<name>"`` (:attr:`Strategy.key`).
"""
from __future__ import annotations

import ast
import functools
import hashlib
import io
import inspect
import itertools
import tokenize
import typing
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Optional, Sequence

from pydantic import BaseModel, ConfigDict

from samu_tune.device import DeviceInfo, device_info
from samu_tune.problem import Problem

def device_reasons(problem_device: str, devices: frozenset[str], triton: bool,
                   device: Optional[DeviceInfo]) -> list[str]:
    """Why a strategy for ``devices`` (Triton kernels when ``triton``) cannot run on
    ``problem_device`` ("cuda"/"cpu"); the CPU runs Triton kernels only under the interpreter."""
    if problem_device == "cpu" and triton and "cpu" not in devices:
        if device is None or not device.interpret:
            return ["CPU tensors need TRITON_INTERPRET=1 for Triton kernels"]
    elif problem_device not in devices:
        return [f"device {problem_device} not in {sorted(devices)}"]
    return []


class EmptyConfig(BaseModel):
    """The config of a strategy without options."""

    model_config = ConfigDict(frozen=True)


def config_space(model: type[BaseModel]) -> list[BaseModel]:
    """Every config of ``model``: the product of its ``Literal[...]`` (or bool) fields."""
    return list(_config_space(model))


@functools.lru_cache(maxsize=None)
def _config_space(model: type[BaseModel]) -> tuple[BaseModel, ...]:
    # built once per model: thousands of pydantic instances cost tens of ms, and configs
    # are frozen (immutable), so every caller can share them
    names, choices = [], []
    for name, info in model.model_fields.items():
        ann = info.annotation
        if typing.get_origin(ann) is typing.Literal:
            values = typing.get_args(ann)
        elif ann is bool:
            values = (False, True)
        else:
            raise TypeError(f"{model.__name__}.{name}: config fields must be Literal[...] or bool")
        names.append(name)
        choices.append(values)
    return tuple(model(**dict(zip(names, combo))) for combo in itertools.product(*choices))


RunFn = Callable[[Any, BaseModel], Any]  # scan: (ScanInputs, config) -> ScanOutput


@dataclass(frozen=True, eq=False)
class Strategy:
    """A registered strategy of one op (``op``: ``"scan"`` by default, ``"decode"``, ...).

    ``run(inputs, cfg)`` executes it (the op's inputs and outputs: :class:`ScanInputs` ->
    :class:`ScanOutput` with autograd support for the scan; see the op's spec in
    :mod:`samu_tune.opspec`); ``valid(problem, cfg)`` prunes the
    config space; ``default(problem)`` gives the config dispatch uses without tuning;
    ``workspace_bytes(problem, cfg)`` is the extra device memory beyond inputs and outputs;
    ``priority`` orders rule-based choice (higher first); ``modules`` are hashed into
    :attr:`source_hash` so a change to the strategy or its kernels invalidates its cache entries.
    ``fit(problem, cfg)``, optional, adapts a config tuned for another problem to this one
    (dispatch applies it to a nearest-key entry, never to an exact one): e.g. a mode tile that
    covers M with fewer padded modes.  It returns ``cfg`` itself where nothing changes; a
    fitted config that is not valid for the problem is not used.
    """

    name: str
    description: str
    capability: Any  # Capability for the scan; an op's own model with reasons(problem, device)
    run: RunFn
    config_model: type[BaseModel] = EmptyConfig
    valid: Optional[Callable[[Problem, BaseModel], bool]] = None
    default: Optional[Callable[[Problem], BaseModel]] = None
    fit: Optional[Callable[[Problem, BaseModel], BaseModel]] = None
    workspace_bytes: Callable[[Problem, BaseModel], int] = lambda problem, cfg: 0
    priority: int = 0
    modules: tuple[ModuleType, ...] = ()
    op: str = "scan"
    # the scan's autograd Function and launch plan of a config (``(Function, plan)``, the
    # Function called as ``Function.forward(ctx, plan, seg, eta, delta, nu_log, theta_log,
    # br, bi, h0_r, h0_i)``): lets the torch.library operators run its forward and backward
    # separately (:mod:`samu_tune.ops.scan.library`); None: they differentiate ``run`` again
    autograd: Optional[Callable[[BaseModel], tuple[type, Any]]] = None
    _hash: list = field(default_factory=list, repr=False)

    @property
    def key(self) -> str:
        """The registry key: the bare name for the scan, ``"<op>:<name>"`` for other ops."""
        return qualified(self.name, self.op)

    def configs(self, problem: Optional[Problem] = None) -> list[BaseModel]:
        """The config space, pruned by :attr:`valid` for ``problem`` when given."""
        space = config_space(self.config_model)
        if problem is None or self.valid is None:
            return space
        return [cfg for cfg in space if self.valid(problem, cfg)]

    def default_config(self, problem: Problem) -> BaseModel:
        if self.default is not None:
            return self.default(problem)
        configs = self.configs(problem)
        if not configs:
            raise ValueError(f"strategy {self.name!r} has no valid config for {problem.key()}")
        return configs[0]

    def parse_config(self, config: BaseModel | dict | None, problem: Optional[Problem] = None
                     ) -> BaseModel:
        """A config of this strategy from a model, a dict (e.g. read from JSON) or None."""
        if config is None:
            if problem is None:
                raise ValueError("a problem is needed to choose the default config")
            return self.default_config(problem)
        if isinstance(config, self.config_model):
            return config
        if isinstance(config, BaseModel):
            config = config.model_dump()
        self.check_fields(config)
        return self.config_model(**config)

    def check_fields(self, config: dict) -> None:
        """ValueError naming ``config``'s keys that are not fields of the config model (e.g. a
        cached config of an older version of the strategy).  Plain dict and set work on the
        model's field table, so torch.compile traces it whole (the scan checks a strategy
        argument under it: :mod:`samu_tune.ops.scan.api`)."""
        fields = self.config_model.__pydantic_fields__
        unknown = set(config) - set(fields)
        if unknown:
            raise ValueError(f"unknown config fields {sorted(unknown)} for strategy "
                             f"{self.name!r}; fields: {list(fields)}")

    def reasons(self, problem: Problem, device: Optional[DeviceInfo] = None) -> list[str]:
        out = self.capability.reasons(problem, device)
        if (not out and self.valid is not None
                and not any(self.valid(problem, cfg) for cfg in _config_space(self.config_model))):
            out.append("no valid config for this problem")
        return out

    @property
    def source_hash(self) -> str:
        """sha256 (16 hex) of the code of the strategy's modules (:func:`code_text`: without
        docstrings, comments and blank lines, imports by the names they bind), so that a
        documentation edit or a move of modules keeps every cached and shipped entry of the
        strategy served."""
        if not self._hash:
            digest = hashlib.sha256(self.key.encode())
            for module in self.modules:
                try:
                    digest.update(code_text(inspect.getsource(module)).encode())
                except (OSError, TypeError):
                    digest.update(module.__name__.encode())
            self._hash.append(digest.hexdigest()[:16])
        return self._hash[0]


def code_text(source: str) -> str:
    """``source`` as what decides the code: without its docstrings (module, class and
    function), comments, trailing whitespace and blank lines, and with each import statement
    reduced to the names it binds (``from samu_tune.kernels import lookback as k`` ->
    ``import lookback as k``), so a documentation edit or a move of the package's modules
    keeps every cached and shipped entry served (a strategy lists the modules whose code it
    runs: those are hashed themselves).  Text, not ``ast.dump``, whose output changes between Python versions."""
    lines = source.splitlines()
    edits: list[tuple[int, int, int, int, str]] = []   # (row0, col0, row1, col1, replacement)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                d = body[0]
                edits.append((d.lineno, d.col_offset, d.end_lineno, d.end_col_offset, ""))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            edits.append((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset,
                          _import_text(node)))
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                edits.append((*tok.start, *tok.end, ""))
    except (tokenize.TokenError, IndentationError):  # pragma: no cover - parsed above
        pass
    # replace each span, last first (column offsets are in characters of one line)
    for r0, c0, r1, c1, text in sorted(edits, reverse=True):
        head, tail = lines[r0 - 1][:c0], lines[r1 - 1][c1:]
        lines[r0 - 1:r1] = [head + text + tail]
    return "\n".join(line.rstrip() for line in lines if line.strip())


def _import_text(node: "ast.Import | ast.ImportFrom") -> str:
    """An import statement as the names it binds: ``import <last component> [as <alias>]``."""
    return "import " + ", ".join(a.name.rsplit(".", 1)[-1] + (f" as {a.asname}" if a.asname else "")
                                 for a in node.names)


_REGISTRY: dict[str, Strategy] = {}
_GENERATION = [0]  # bumped by register/unregister: dispatch memoizes decisions on it


def generation() -> int:
    """Changes whenever a strategy is registered or unregistered."""
    return _GENERATION[0]


def qualified(name: str, op: str = "scan") -> str:
    """The registry key of strategy ``name`` of ``op`` (see the module docstring)."""
    return name if op == "scan" else f"{op}:{name}"


def register(strategy: Strategy, *, replace: bool = False) -> Strategy:
    """Add ``strategy`` to the registry; a second strategy of the same op and name is an error."""
    if strategy.key in _REGISTRY and not replace:
        raise ValueError(f"{strategy.op} strategy {strategy.name!r} is already registered")
    _REGISTRY[strategy.key] = strategy
    _GENERATION[0] += 1
    return strategy


def unregister(name: str, op: str = "scan") -> None:
    _REGISTRY.pop(qualified(name, op), None)
    _GENERATION[0] += 1


def _ensure_builtin() -> None:
    from samu_tune import opspec
    opspec.load_builtin()


def get(name: str, op: str = "scan") -> Strategy:
    """The registered strategy ``name`` of ``op``; ValueError naming the op's strategies."""
    _ensure_builtin()
    try:
        return _REGISTRY[qualified(name, op)]
    except KeyError:
        known = sorted(s.name for s in _REGISTRY.values() if s.op == op)
        what = "strategy" if op == "scan" else f"{op} strategy"
        raise ValueError(f"unknown {what} {name!r}; registered: {known}") from None


def all_strategies(op: str = "scan") -> list[Strategy]:
    """The registered strategies of ``op``, highest priority first."""
    _ensure_builtin()
    return sorted((s for s in _REGISTRY.values() if s.op == op),
                  key=lambda s: (-s.priority, s.name))


def ops() -> list[str]:
    """The ops that have registered strategies."""
    _ensure_builtin()
    return sorted({s.op for s in _REGISTRY.values()})


def eligible(problem: Problem, device: Optional[DeviceInfo] = None,
             names: Optional[Sequence[str]] = None) -> list[tuple[Strategy, list[str]]]:
    """Every strategy of ``problem.op`` (or those in ``names``) with its reasons; eligible
    ones have none."""
    if device is None:
        device = device_info("cuda" if problem.device == "cuda" else "cpu")
    op = problem.op
    chosen = all_strategies(op) if names is None else [get(n, op) for n in names]
    return [(s, s.reasons(problem, device)) for s in chosen]


def format_reasons(pairs: list[tuple[Strategy, list[str]]]) -> str:
    """One line per strategy: ``name: ok`` or ``name: reason; reason``."""
    return "\n".join(f"  {s.name}: {'; '.join(r) if r else 'eligible'}" for s, r in pairs)
