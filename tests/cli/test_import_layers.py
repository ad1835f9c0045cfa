"""Every module's imports against the layer table of docs/architecture.md, read statically.

The table: the shared declarations at ``probe/``'s root import only each other; the engine
side (``probe/engine/``, inside vLLM) imports the root; the reader side (``probe/reader/``)
imports the root; analysis (``probe/analysis/``) the root and the reader; the CLI
(``probe/cli/``) anything; ``exporters/`` the root, the reader and analysis; ``dashboards/``
those and ``exporters/``. Imports inside functions count the same as those at the top, and
no two modules may import each other, directly or around a circle (imports under ``if
TYPE_CHECKING:`` never run and are not counted). Within the CLI, the commands
(``probe/cli/commands/*``) share code through the modules below them (``probe/cli/``, the
package's own ``__init__``), never through each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("probe", "exporters", "dashboards")

# layer -> the layers it may import (itself included)
MAY_IMPORT: dict[str, set[str]] = {
    "root": {"root"},
    "engine": {"root", "engine"},
    "reader": {"root", "reader"},
    "analysis": {"root", "reader", "analysis"},
    "cli": {"root", "engine", "reader", "analysis", "cli", "exporters", "dashboards"},
    "exporters": {"root", "reader", "analysis", "exporters"},
    "dashboards": {"root", "reader", "analysis", "exporters", "dashboards"},
}


def layer_of(module: str) -> str:
    if module == "probe.__main__":  # ``python -m probe``: the command's entry
        return "cli"
    parts = module.split(".")
    if parts[0] in ("exporters", "dashboards"):
        return parts[0]
    if len(parts) > 1 and parts[1] in ("engine", "reader", "analysis", "cli"):
        return parts[1]
    return "root"


def modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            rel = p.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


_TYPE_CHECKING = ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project's modules ``name`` imports: ``from a import b`` counts ``a.b`` where that
    is a module, else ``a``, as import checkers do (a package's ``__init__`` that imports
    one of its own modules lazily is no circle)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    # imports for type checking only never run: not an edge
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test) in _TYPE_CHECKING
        for stmt in block.body
        for n in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join([*pkg, base] if base else pkg)
            targets = [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and t.split(".")[0] in PACKAGES:
                found.add(t)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports_of(m, p, known) for m, p in mods.items()}


def test_the_layer_table_names_every_module() -> None:
    assert {layer_of(m) for m in graph()} <= set(MAY_IMPORT)


def test_no_import_goes_against_the_layer_table() -> None:
    bad = sorted(
        f"{m} ({layer_of(m)}) imports {t} ({layer_of(t)})"
        for m, targets in graph().items()
        for t in targets
        if layer_of(t) not in MAY_IMPORT[layer_of(m)]
    )
    assert bad == []


COMMANDS = "probe.cli.commands"


def is_command(module: str) -> bool:
    """One command's module: ``probe.cli.commands.<name>`` (not the package's shared helpers)."""
    return module.startswith(f"{COMMANDS}.")


def commands_importing_commands(g: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{m} imports {t}"
        for m, targets in g.items()
        if is_command(m)
        for t in targets
        if is_command(t)
    )


def test_no_command_imports_another_command() -> None:
    assert commands_importing_commands(graph()) == []


def _circles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
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
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def _parent_edges(g: dict[str, set[str]]) -> dict[str, set[str]]:
    """Without the edges from a module to the packages that contain it: importing
    ``a.b.c`` runs ``a/b/__init__`` first, so a package re-exporting its modules is no circle."""
    return {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in g.items()}


def test_no_module_imports_itself_around_a_circle() -> None:
    assert _circles(_parent_edges(graph())) == []


def test_the_checks_see_a_violation_and_a_circle() -> None:
    """The checks are not vacuous: a made-up engine module importing the reader is a
    violation, two modules importing each other are a circle, and a command importing
    another command (not the shared helpers; not the parser importing a command) is seen."""
    g = {"probe.engine.x": {"probe.reader.y"}, "probe.reader.y": {"probe.engine.x"}}
    assert layer_of("probe.engine.x") == "engine"
    assert "reader" not in MAY_IMPORT["engine"]
    assert _circles(g) == [["probe.engine.x", "probe.reader.y"]]
    shared = {"probe.cli.commands.a": {"probe.cli.commands", "probe.cli.options"}}
    assert commands_importing_commands(shared) == []
    g = {
        "probe.cli.commands.a": {"probe.cli.commands.b"},
        "probe.cli.main": {"probe.cli.commands.a"},
    }
    assert commands_importing_commands(g) == ["probe.cli.commands.a imports probe.cli.commands.b"]
