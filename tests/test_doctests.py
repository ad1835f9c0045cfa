"""The examples in the modules' docstrings run and print what they show."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import probe

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(probe.__path__, "probe.")
    if not m.name.endswith(("__main__", "._accel"))
)


def _with_examples() -> list[str]:
    out = []
    for name in MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:  # an optional extra's module: its own tests skip
            continue
        examples = [e for t in doctest.DocTestFinder().find(mod) for e in t.examples]
        if any(not e.options.get(doctest.SKIP) for e in examples):
            out.append(name)
    return out


@pytest.mark.parametrize("name", _with_examples())
def test_docstring_examples(name: str) -> None:
    mod = importlib.import_module(name)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
    assert result.attempted > 0
