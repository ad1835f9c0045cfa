"""Every module's imports against the layer table of docs/architecture.md, read statically.

The table: the shared declarations at ``probe/``'s root import only each other; the engine
side (``probe/engine/``, inside vLLM) imports the root; the reader side (``probe/reader/``)
imports the root; analysis (``probe/analysis/``) the root and the reader; the CLI
(``probe/cli/``) anything; ``exporters/`` the root, the reader and analysis; ``dashboards/``
those and ``exporters/``. Imports inside functions count the same as those at the top, and
no two modules may import each other, directly or around a circle. Imports under ``if
TYPE_CHECKING:`` never run: the layer table does not count them, but a circle through them
is still one (two modules that need each other's types are one module in two files, or
share a third). Within the CLI, the commands
(``probe/cli/commands/*``) share code through the modules below them (``probe/cli/``, the
package's own ``__init__``), never through each other.

Imports by string count too: ``importlib.import_module("a.b")`` and ``__import__("a.b")``
with a literal name, and an f-string's literal head (``f"probe.cli.commands.{name}"``
imports the package ``probe.cli.commands``). vLLM and torch are imported only where the
table allows them: the engine side, which runs inside vLLM, and the two modules that call
the installed vLLM from ``probe``'s own process: the what-if's loader
(``probe/analysis/whatif_vllm.py``: analysis of a recording through vLLM's own resolver and
dispatcher) and ``probe/reasons.py``'s ``split_from_metadata`` (vLLM's own split, the
reference the miss-reason rules are checked against). No module imports another's
private (``_``) name.
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


def imports_of(name: str, path: Path, known: set[str], typing: bool = False) -> set[str]:
    """The project's modules ``name`` imports: ``from a import b`` counts ``a.b`` where that
    is a module, else ``a``, as import checkers do (a package's ``__init__`` that imports
    one of its own modules lazily is no circle). ``typing``: those imported under ``if
    TYPE_CHECKING:`` too (they never run)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    # imports for type checking only never run: not an edge, unless asked for
    typing_only = set() if typing else {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test) in _TYPE_CHECKING
        for stmt in block.body
        for n in ast.walk(stmt)
    }  # fmt: skip
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Call) and (by_string := string_import(node)):
            targets = [by_string]
        elif isinstance(node, ast.Import):
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


def string_import(call: ast.Call) -> str:
    """The module a call imports by name: ``importlib.import_module(NAME)``,
    ``import_module(NAME)`` or ``__import__(NAME)`` with NAME a literal, or the package an
    f-string's literal head names (``f"a.b.{x}"``: ``a.b``); "" for any other call."""
    fn = ast.unparse(call.func)
    if fn not in ("importlib.import_module", "import_module", "__import__") or not call.args:
        return ""
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values:
        head = arg.values[0]
        if isinstance(head, ast.Constant) and isinstance(head.value, str):
            return head.value.rpartition(".")[0]
    return ""


# the third-party packages a layer must name before it imports them, and who may
THIRD_PARTY = ("vllm", "torch")
MAY_IMPORT_VLLM = {"probe.analysis.whatif_vllm", "probe.reasons"}


def third_party_imports(path: Path) -> set[str]:
    """The :data:`THIRD_PARTY` packages a module imports, by statement or by string,
    type-checking blocks aside."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test) in _TYPE_CHECKING
        for stmt in block.body
        for n in ast.walk(stmt)
    }
    names: list[str] = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Call) and (by_string := string_import(node)):
            names.append(by_string)
    return {n.split(".")[0] for n in names} & set(THIRD_PARTY)


def may_import_vllm(module: str) -> bool:
    return layer_of(module) == "engine" or module in MAY_IMPORT_VLLM


def private_imports(name: str, path: Path) -> list[str]:
    """``from other_module import _name`` of the project's modules (a module's own
    package-private helpers stay in it; what another module needs has a public name)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = node.module or ""
        if node.level:
            pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            pkg = pkg[: len(pkg) - (node.level - 1)]
            base = ".".join([*pkg, base] if base else pkg)
        if base.split(".")[0] not in PACKAGES:
            continue
        out += [
            f"{name} imports {base}.{a.name}"
            for a in node.names
            if a.name.startswith("_") and not a.name.startswith("__")
        ]
    return out


def graph(typing: bool = False) -> dict[str, set[str]]:
    """Each module's imports of the project's modules (``typing``: type-checking ones too)."""
    mods = modules()
    known = set(mods)
    return {m: imports_of(m, p, known, typing) for m, p in mods.items()}


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


def a_circle(g: dict[str, set[str]], comp: list[str]) -> list[str]:
    """One circle through the modules of ``comp`` (a strongly connected component of
    ``g``), as the path of imports ``a -> b -> ... -> a`` from its first module."""
    inside = set(comp)
    start = comp[0]
    # breadth first from the start's imports back to the start: the shortest circle through it
    came: dict[str, str] = {}
    todo = [start]
    while todo:
        nxt: list[str] = []
        for v in todo:
            for w in sorted(g.get(v, set()) & inside):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in came:
                    came[w] = v
                    nxt.append(w)
        todo = nxt
    return comp


def circles(g: dict[str, set[str]]) -> list[str]:
    """Every circle of imports in ``g`` (package parents aside), one path per strongly
    connected component, in words."""
    g = _parent_edges(g)
    return [" -> ".join(a_circle(g, comp)) for comp in _circles(g)]


def test_no_module_imports_itself_around_a_circle() -> None:
    """No circle of imports between the modules of ``probe/``, ``exporters/`` and
    ``dashboards/``: every import counts, at a module's top, inside a function (run
    later, still an edge) or under ``if TYPE_CHECKING:``."""
    g = graph(typing=True)
    assert circles(g) == []
    # the graph holds the imports of all three kinds
    assert "probe.cli.commands" in g["probe.cli.main"]  # by string, at call time
    assert "probe.analysis.accumulators" in g["probe.analysis.figures"]


def test_the_checks_see_a_violation_and_a_circle() -> None:
    """The checks are not vacuous: a made-up engine module importing the reader is a
    violation, two modules importing each other are a circle, and a command importing
    another command (not the shared helpers; not the parser importing a command) is seen."""
    g = {"probe.engine.x": {"probe.reader.y"}, "probe.reader.y": {"probe.engine.x"}}
    assert layer_of("probe.engine.x") == "engine"
    assert "reader" not in MAY_IMPORT["engine"]
    assert _circles(g) == [["probe.engine.x", "probe.reader.y"]]
    assert circles(g) == ["probe.engine.x -> probe.reader.y -> probe.engine.x"]
    # three modules around (the package's ``__init__`` importing its module is no circle)
    three = {"a.x": {"a.y"}, "a.y": {"a.z", "a"}, "a.z": {"a.x"}, "a": {"a.y"}}
    assert circles(three) == ["a.x -> a.y -> a.z -> a.x"]


def test_type_checking_and_function_imports_are_edges_of_the_circle_check(tmp_path: Path) -> None:
    """An import under ``if TYPE_CHECKING:`` is an edge for the circle check (not for the
    layer table), and one inside a function is an edge for both."""
    mod = tmp_path / "m.py"
    mod.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from probe.analysis.summary import Summary\n"
        "def f() -> None:\n"
        "    from probe.analysis import cost\n",
        encoding="utf-8",
    )
    known = set(modules())
    assert imports_of("probe.analysis.m", mod, known) == {"probe.analysis.cost"}
    assert imports_of("probe.analysis.m", mod, known, typing=True) == {
        "probe.analysis.cost",
        "probe.analysis.summary",
    }
    shared = {"probe.cli.commands.a": {"probe.cli.commands", "probe.cli.options"}}
    assert commands_importing_commands(shared) == []
    g = {
        "probe.cli.commands.a": {"probe.cli.commands.b"},
        "probe.cli.main": {"probe.cli.commands.a"},
    }
    assert commands_importing_commands(g) == ["probe.cli.commands.a imports probe.cli.commands.b"]


def test_string_imports_are_edges() -> None:
    """``importlib.import_module`` with a literal or an f-string head, and ``__import__``,
    are seen: the parser's commands, the live sinks' exporters."""
    g = graph()
    assert "probe.cli.commands" in g["probe.cli.main"]
    assert "exporters" in g["probe.cli.live_options"]
    call = ast.parse('__import__("probe.reader.recording")').body[0]
    assert isinstance(call, ast.Expr) and isinstance(call.value, ast.Call)
    assert string_import(call.value) == "probe.reader.recording"
    call = ast.parse('importlib.import_module(f"exporters.{name}")').body[0]
    assert isinstance(call, ast.Expr) and isinstance(call.value, ast.Call)
    assert string_import(call.value) == "exporters"


def test_vllm_and_torch_only_where_the_table_allows() -> None:
    bad = sorted(
        f"{m} ({layer_of(m)}) imports {pkg}"
        for m, p in modules().items()
        for pkg in third_party_imports(p)
        if not may_import_vllm(m)
    )
    assert bad == []
    # not vacuous: the engine and the what-if's loader do import them
    mods = modules()
    assert "vllm" in third_party_imports(mods["probe.analysis.whatif_vllm"])
    assert "torch" in third_party_imports(mods["probe.analysis.whatif_vllm"])


def test_the_configuration_imports_no_other_module_of_the_probe() -> None:
    """``config`` is the floor: the ring, the run directory and the control protocol read
    it, and it reads none of them."""
    assert graph()["probe.config"] == set()


def test_no_module_imports_another_modules_private_name() -> None:
    assert [line for m, p in modules().items() for line in private_imports(m, p)] == []
