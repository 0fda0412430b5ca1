"""Cache identity: a strategy's source hash covers its code, not its documentation."""
from __future__ import annotations

import inspect

import pytest

from samu_tune import registry
from samu_tune.registry import code_text

SOURCE = '''"""Module doc."""
import math  # why


def f(a, b=2):
    """What f does.

    More words."""
    s = "a string, not a docstring"  # note
    return math.sqrt(a) + b  # trailing


class C:
    """Doc of C."""

    x = 1
'''


def test_docstring_and_comment_edits_keep_the_code_text():
    edited = (SOURCE.replace("What f does.\n\n    More words.", "Rewritten, one line.")
              .replace("# note", "# another note").replace('"""Doc of C."""', '"""Doc."""\n'))
    assert code_text(edited) == code_text(SOURCE)
    assert "Module doc" not in code_text(SOURCE) and "# note" not in code_text(SOURCE)
    assert "a string, not a docstring" in code_text(SOURCE)


@pytest.mark.parametrize("change", [("+ b", "- b"), ("x = 1", "x = 2"), ("b=2", "b=3"),
                                    ('"a string', '"another string')])
def test_code_edits_change_the_code_text(change):
    assert code_text(SOURCE.replace(*change)) != code_text(SOURCE)


@pytest.mark.parametrize("name", ["lookback", "serial", "chunk"])
def test_builtin_strategy_hash_ignores_its_modules_docstrings(name):
    strat = registry.get(name)
    module = strat.modules[0]
    source = inspect.getsource(module)
    doc = module.__doc__
    assert doc and doc in source
    assert code_text(source.replace(doc, doc + "\nOne more documented sentence.\n")) \
        == code_text(source)


PACKAGED = '''from samu_tune.kernels import lookback as lookback_kernels
from samu_tune import alloc as _alloc, autograd as _grads


def g():
    from samu_tune.ops.scan import controls
    return controls
'''


def test_a_move_of_modules_keeps_the_code_text():
    moved = (PACKAGED.replace("samu_tune.kernels", "samu_tune.ops.scan.kernels")
             .replace("from samu_tune import alloc", "from ..core import alloc")
             .replace("samu_tune.ops.scan import controls", ".. import controls"))
    assert code_text(moved) == code_text(PACKAGED)


@pytest.mark.parametrize("change", [("lookback as", "chunk as"), ("as _grads", "as grads"),
                                    ("import controls", "import control")])
def test_a_change_of_what_is_imported_changes_the_code_text(change):
    assert code_text(PACKAGED.replace(*change)) != code_text(PACKAGED)
