"""The examples in the modules' docstrings run and print what they show."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil
from typing import Any

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


class _Runner(doctest.DocTestRunner):
    """Counts failures as doctest does, and keeps the packages an example missed."""

    missing: set[str]

    def report_unexpected_exception(self, out: Any, test: Any, example: Any, exc_info: Any) -> None:
        if isinstance(exc_info[1], ModuleNotFoundError) and exc_info[1].name:
            self.missing.add(exc_info[1].name.split(".")[0])
        super().report_unexpected_exception(out, test, example, exc_info)


@pytest.mark.parametrize("name", _with_examples())
def test_docstring_examples(name: str) -> None:
    mod = importlib.import_module(name)
    runner = _Runner(optionflags=doctest.ELLIPSIS, verbose=False)
    runner.missing = set()
    for test in doctest.DocTestFinder().find(mod):
        runner.run(test, out=lambda _text: None)
    absent = {p for p in runner.missing if importlib.util.find_spec(p) is None}
    if absent:
        pytest.skip(f"needs {', '.join(sorted(absent))}, not installed")
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
    assert result.attempted > 0
