"""The package's layout: no import loop anywhere in lingpipe/, and lower layers never
import higher ones.

The imports are read from the source (ast), module-level and function-level alike (a
function-level import is a dependency too, only a later one), so a loop shows here even
when Python would import it without error.
"""

import ast
import pathlib
import subprocess
import sys

import pytest

import lingpipe

ROOT = pathlib.Path(lingpipe.__file__).parent


def _ModuleName(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_ModuleName(p): p for p in sorted(ROOT.rglob("*.py"))}


def _Resolve(name: str) -> str | None:
    """The module of lingpipe's that importing `name` runs: `name`, or the package that
    holds it (`from lingpipe.keras import Pipeline` depends on lingpipe.keras)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def Imports(module: str) -> set[str]:
    """lingpipe's modules that `module` imports, at any level of its source."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(_Resolve(a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . import x; from ..y import z
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found.update(_Resolve(f"{base}.{a.name}") for a in node.names)
    return found - {None, module}


def ImportLoops(graph: dict[str, set[str]]) -> list[list[str]]:
    """For each set of modules that reach each other (a strongly connected set, Tarjan's
    algorithm), the shortest loop from its first module back to it."""
    index, low, stack, on_stack, loops = {}, {}, [], set(), []

    def Visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                Visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = {v}
            while stack[-1] != v:
                members.add(stack.pop())
            on_stack.difference_update(members)
            stack.pop()
            if len(members) > 1:
                loops.append(_ShortestLoop(graph, members))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in sorted(graph):
        if v not in index:
            Visit(v)
    return loops


def _ShortestLoop(graph: dict[str, set[str]], members: set[str]) -> list[str]:
    """Breadth-first inside `members`, from their first module back to it."""
    start = min(members)
    routes, frontier = {start: [start]}, [start]
    while frontier:
        ahead = []
        for here in frontier:
            for n in sorted(graph[here] & members):
                if n == start:
                    return [*routes[here], start]
                if n not in routes:
                    routes[n] = [*routes[here], n]
                    ahead.append(n)
        frontier = ahead
    raise AssertionError(f"{sorted(members)} is not strongly connected")


def test_the_import_reader_sees_every_kind_of_import(tmp_path):
    source = (
        "import lingpipe.asserts\n"
        "from lingpipe import seeds\n"
        "from lingpipe.nested_map import NestedMap\n"
        "def f():\n"
        "    from lingpipe import hyperparams\n"
        "if __name__ == '__main__':\n"
        "    from lingpipe import demo\n"
    )
    path = ROOT / "_layout_probe.py"
    MODULES["lingpipe._layout_probe"] = path
    try:
        path.write_text(source)
        assert Imports("lingpipe._layout_probe") == {
            "lingpipe.asserts",
            "lingpipe.seeds",
            "lingpipe.nested_map",
            "lingpipe.hyperparams",
            "lingpipe.demo",
        }
    finally:
        path.unlink()
        del MODULES["lingpipe._layout_probe"]


def test_import_loops_are_found_and_printed_as_a_path():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": {"e"}}
    assert sorted(ImportLoops(graph)) == [["a", "b", "c", "a"], ["e", "e2", "e"]]
    assert ImportLoops({"a": {"b"}, "b": set()}) == []


def test_no_import_loop_anywhere_in_lingpipe():
    graph = {m: Imports(m) & set(MODULES) for m in MODULES}
    loops = ImportLoops(graph)
    assert not loops, "import loops in lingpipe/:\n" + "\n".join(" -> ".join(x) for x in loops)


# A lower layer never imports a higher one (STYLE.md): the engine is below the layers,
# the models, the Keras front end and the binaries; the text format below Params.
LOWER_THAN = {
    "lingpipe.pipeline": (
        "lingpipe.layers",
        "lingpipe.models",
        "lingpipe.keras",
        "lingpipe.runners",
        "lingpipe.trainer",
        "lingpipe.plan",
        "lingpipe.worker",
    ),
    "lingpipe.params_text": ("lingpipe",),
}


@pytest.mark.parametrize("lower", sorted(LOWER_THAN))
def test_a_lower_layer_imports_nothing_above_it(lower):
    below = [m for m in MODULES if m == lower or m.startswith(lower + ".")]
    assert below, lower
    higher = LOWER_THAN[lower]
    wrong = {
        f"{m} imports {n}"
        for m in below
        for n in Imports(m)
        if any(n == h or n.startswith(h + ".") for h in higher) and not n.startswith(lower)
    }
    assert not wrong, sorted(wrong)


@pytest.mark.parametrize(
    "first",
    [
        "lingpipe.pipeline.observe.plot",
        "lingpipe.pipeline.schedules.cli",
        "lingpipe.pipeline.schedules.generators",
    ],
)
def test_a_module_imported_first_imports_cleanly(first):
    # Python itself finds a loop only when the module at its top is imported first.
    code = f"import {first}, lingpipe.pipeline.schedules.schedule, lingpipe.hyperparams"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
