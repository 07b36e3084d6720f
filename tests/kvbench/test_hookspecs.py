"""The hook contract: every hookspec is prefixed, documented, and exercised by some test."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from kvbench import hookspecs

HOOKS = sorted(name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("kvbench_"))
TESTS_DIR = Path(__file__).resolve().parents[1]


def test_there_are_hooks_and_all_are_prefixed():
    assert HOOKS
    public = [n for n, f in inspect.getmembers(hookspecs, inspect.isfunction) if f.__module__ == hookspecs.__name__]
    assert all(n.startswith("kvbench_") for n in public), public


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_a_docstring(hook):
    doc = inspect.getdoc(getattr(hookspecs, hook))
    assert doc and len(doc.split()) >= 8, f"hookspec {hook} needs a docstring saying what it is for"


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_a_test(hook):
    # a test function named test_<hook>... anywhere in the suite, or a case of a parametrized test
    # named by the hook (id="<hook>"), besides this file's generic ones
    names = (f"def test_{hook}", f'id="{hook}"')
    found = [
        p
        for p in TESTS_DIR.rglob("test_*.py")
        if p.name != Path(__file__).name and any(name in p.read_text() for name in names)
    ]
    assert found, f"hookspec {hook} has no test: add a test function named test_{hook}_... (or a case id={hook!r})"
