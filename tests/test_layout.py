"""The package's layout rules: no import cycle between its modules, each file small or saying
why it is not, and no measurement history (result paths, experiment tags) in the code."""
from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "samu_tune"
MAX_LINES = 420   # "about 400": longer files say why in their docstring ("Long because")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _top_level_imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The package modules ``path`` imports when it is imported (statements at module level,
    ``if`` / ``try`` blocks included; imports inside functions run later and are not edges)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()

    def visit(stmts):
        for node in stmts:
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (node.level - 1)]
                    base = ".".join(pkg + ([node.module] if node.module else []))
                for a in node.names:
                    full = f"{base}.{a.name}"
                    out.add(full if full in known else base)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for h in getattr(node, "handlers", []):
                    visit(h.body)
    visit(ast.parse(path.read_text()).body)
    edges = set()
    for target in out:
        # importing a.b.c imports the packages a and a.b first
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in known and prefix != name:
                edges.add(prefix)
    return edges


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def _package_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Drop the edges from a package's ``__init__`` to its own submodules (a package
    re-exporting its modules is not a cycle)."""
    return {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}


def test_no_import_cycle():
    mods = _modules()
    graph = {m: _top_level_imports(p, m, set(mods)) for m, p in mods.items()}
    assert _cycles(_package_edges(graph)) == []


def test_the_cycle_check_can_fail():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_files_are_small_or_say_why():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        n = len(path.read_text().splitlines())
        if n > MAX_LINES:
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            if "Long because" not in doc and "long because" not in doc:
                long.append(f"{path.relative_to(PACKAGE)}: {n} lines")
    assert long == []


# result files, per-run experiment tags ("s15", "s13b") and issue numbers belong in
# docs/performance.md, not in the code
HISTORY = re.compile(r"scripts/results|benchmarks/results|\bs1[0-9][a-h]?\b|\(issue \d+\)|"
                     r"\bissue #?\d+\b|\bsession\b", re.IGNORECASE)


def test_no_measurement_history_in_the_code():
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if HISTORY.search(line):
                hits.append(f"{path.relative_to(PACKAGE)}:{i}: {line.strip()}")
    assert hits == []
