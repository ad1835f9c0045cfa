"""The documentation a user reads, held to the repository as it is: every path it names
exists, it cites no document that is not shipped, plans and scripts are named by topic,
and the tests read nothing outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TOP = r"(?:probe|exporters|dashboards|tests|benchmarks|docs|scripts|\.ci)"
# a repository path: a top folder, then path characters (a glob's * included)
PATH = re.compile(r"(?<![\w/.-])(" + TOP + r"/[A-Za-z0-9_./*{},-]*[A-Za-z0-9_*}])")
BRACES = re.compile(r"\{([^{}]*)\}")


def expand(path: str) -> list[str]:
    """A shell's brace expansion: ``a{1..3}`` and ``a{x,y}``."""
    m = BRACES.search(path)
    if m is None:
        return [path]
    inner = m.group(1)
    lo, dots, hi = inner.partition("..")
    words = [str(i) for i in range(int(lo), int(hi) + 1)] if dots else inner.split(",")
    return [e for w in words for e in expand(path[: m.start()] + w + path[m.end() :])]


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def user_docs() -> list[Path]:
    """docs/, the README, CONTRIBUTING and the evidence behind the figures."""
    found = [
        *sorted((ROOT / "docs").rglob("*.md")),
        ROOT / "README.md",
        ROOT / "CONTRIBUTING.md",
        ROOT / "benchmarks" / "README.md",
        *sorted((ROOT / "benchmarks" / "evidence").glob("*.md")),
    ]
    return [p for p in found if p.exists()]


def missing_paths(doc: Path) -> list[str]:
    """Repository paths and relative links in ``doc`` that name nothing."""
    text = doc.read_text(encoding="utf-8")
    out = []
    for m in PATH.finditer(text):
        for path in expand(m.group(1).rstrip(".")):
            exists = any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()
            if not exists:
                out.append(f"{doc.relative_to(ROOT)}: {path}")
    for m in LINK.finditer(text):
        target = m.group(1)
        if "://" in target or target.startswith("mailto:"):
            continue
        if not (doc.parent / target).exists():
            out.append(f"{doc.relative_to(ROOT)}: link {target}")
    return out


def test_every_path_the_docs_name_exists() -> None:
    assert [m for doc in user_docs() for m in missing_paths(doc)] == []


def test_the_path_check_sees_a_stale_path(tmp_path: Path) -> None:
    doc = ROOT / "docs" / "architecture.md"
    assert missing_paths(doc) == []
    stale = tmp_path / "stale.md"
    stale.write_text("see `tests/test_whatif.py`, `benchmarks/results/cpu-*` and [x](gone.md)\n")
    text = stale.read_text()
    assert [m.group(1) for m in PATH.finditer(text)] == [
        "tests/test_whatif.py",
        "benchmarks/results/cpu-*",
    ]
    assert not (ROOT / "tests/test_whatif.py").exists()
    assert not any(ROOT.glob("benchmarks/results/cpu-*"))
    assert expand("a/run{1..3}-{x,y}.json") == [
        f"a/run{n}-{w}.json" for n in (1, 2, 3) for w in ("x", "y")
    ]


SHIPPED_NOT = re.compile(r"\bDESIGN(?:\.md)?\b|\bLEAD\b|\bSTYLE rule")


def test_no_reference_to_a_document_not_shipped() -> None:
    """The design notes and the team's names are not in the repository: nothing cites them."""
    hits = []
    for pkg in ("probe", "exporters", "dashboards", "tests", "benchmarks", "docs", "scripts"):
        for p in (ROOT / pkg).rglob("*"):
            if p.suffix not in (".py", ".md", ".sh", ".json", ".c", ".h") or "data" in p.parts:
                continue
            text = p.read_text(encoding="utf-8", errors="replace")
            hits += [f"{p.relative_to(ROOT)}: {m.group(0)}" for m in SHIPPED_NOT.finditer(text)]
    hits += [f"README.md: {m.group(0)}" for m in SHIPPED_NOT.finditer(_read("README.md"))]
    hits = [h for h in hits if not h.startswith("tests/cli/test_docs.py")]
    assert hits == []


ITERATION = re.compile(r"(?:^|[_-])(?:final\d*|plan\d+|[a-z]+\d+_(?:mrv2|v1))(?:[_.-]|$)|\d_final")


def test_plans_and_scripts_are_named_by_topic() -> None:
    named = [p.name for p in (ROOT / "benchmarks").rglob("*") if p.suffix in (".json", ".sh")]
    named = [n for n in named if not n.startswith(("run", "results"))] + [
        p.name for p in (ROOT / "benchmarks").rglob("run_*.sh")
    ]
    assert [n for n in named if ITERATION.search(n) or "final" in n] == []


def _read(rel: str) -> str:
    return (ROOT / rel).read_text(encoding="utf-8")


OUTSIDE = re.compile(r"""PROBE_SHARED_DIR|["'/]shared["'/]|\.\./shared""")


def test_no_test_reads_outside_the_repository() -> None:
    """The real profiler files and AMD's SQL are in tests/data/; a fresh clone with no folder
    beside it runs every test."""
    hits = []
    for p in (ROOT / "tests").rglob("*.py"):
        if p.name == "test_docs.py":
            continue
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()}")
    assert hits == []
    assert (ROOT / "tests/data/profiles/SOURCES.md").exists()
    assert (ROOT / "tests/data/rocpd-schema/LICENSE").exists()


FIGURES = "## Where each figure is computed"
FUNCTION = re.compile(r"`((?:probe|exporters)[\w.]*:[\w.]+)`")


def figure_functions(text: str) -> list[str]:
    """The ``module:function`` names of docs/rules.md's list of where each figure is
    computed."""
    section = text.split(FIGURES, 1)[1].split("\n## ", 1)[0]
    return FUNCTION.findall(section)


def resolves(name: str) -> bool:
    """Whether ``module:attr.attr`` names a callable of the project."""
    import importlib

    module, _, attrs = name.partition(":")
    try:
        obj: object = importlib.import_module(module)
    except ImportError:
        return False
    for a in attrs.split("."):
        obj = getattr(obj, a, None)
        if obj is None:
            return False
    return callable(obj)


def test_every_function_the_rules_name_for_a_figure_exists() -> None:
    """docs/rules.md names, for every family of figures, the one function that computes
    it: each name resolves to a function of the project, and every family is listed."""
    text = (ROOT / "docs/rules.md").read_text(encoding="utf-8")
    names = figure_functions(text)
    assert [n for n in names if not resolves(n)] == []
    section = text.split(FIGURES, 1)[1].lower()
    for family in ("hit rates", "percentiles", "probe cost", "engine idle", "host-bound",
                   "steady state", "skew", "a/b ratio", "interval", "what-if worth",
                   "traps", "reorder stats", "build stats"):  # fmt: skip
        assert family in section, family
    # not vacuous: the list is read, and a name that is gone is seen
    assert "probe.analysis.cost:cost_figures" in names and len(names) >= 20
    assert not resolves("probe.analysis.cost:no_such_function")
    assert not resolves("probe.analysis.no_such_module:figures")
