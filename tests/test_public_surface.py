"""A deliberate public surface: every public module of lingpipe/ says what it exports.

A public module is one whose path has no part starting with an underscore (a package's
`__init__.py` counts as the package). It must define `__all__` as a literal list or tuple
of strings, each bound at the module's top level (def, class, assignment or import,
also inside a top-level `if` or `try`), none twice. A module holding nothing but its
docstring (and dunder names such as `__version__`) needs none. Read from the source
(ast): nothing is imported.
"""

import ast
import pathlib

import pytest

import lingpipe

ROOT = pathlib.Path(lingpipe.__file__).parent

# Modules that only hand out another one under an old name, for one release.
_SHIMS = {"lingpipe.schedules"}


def _Name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _IsPublic(path: pathlib.Path) -> bool:
    parts = path.relative_to(ROOT).parts
    return path.name != "__main__.py" and not any(
        p.startswith("_") for p in parts if p != "__init__.py"
    )


PUBLIC = {_Name(p): p for p in sorted(ROOT.rglob("*.py")) if _IsPublic(p)}


def _Bound(statements: list[ast.stmt]) -> set[str]:
    """Names a module's top level binds, looking into top-level if/try/with blocks."""
    names = set()
    for node in statements:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            inner = [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            inner += [s for h in getattr(node, "handlers", []) for s in h.body]
            names |= _Bound(inner)
    return names


def _IsEmpty(tree: ast.Module) -> bool:
    """Only a docstring, `from __future__` and dunder assignments."""
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and all(
            n.id.startswith("__") for n in ast.walk(node) if isinstance(n, ast.Name)
        ):
            continue
        return False
    return True


def SurfaceError(source: str) -> str | None:
    """What is wrong with the `__all__` of a module with this source; None if nothing."""
    tree = ast.parse(source)
    declared = [
        node
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        and any(
            isinstance(t, ast.Name) and t.id == "__all__"
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        )
    ]
    if not declared:
        return None if _IsEmpty(tree) else "no __all__"
    value = declared[-1].value
    if not isinstance(value, (ast.List, ast.Tuple)) or not all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts
    ):
        return "__all__ is not a literal list of strings"
    names = [e.value for e in value.elts]
    twice = sorted({n for n in names if names.count(n) > 1})
    missing = sorted(set(names) - _Bound(tree.body))
    if twice or missing:
        return (
            f"__all__ names {missing} that the module does not define"
            if missing
            else (f"__all__ lists {twice} twice")
        )
    return None


@pytest.mark.parametrize(
    "source, error",
    [
        ("def F(): pass\n", "no __all__"),
        ('"""Only a docstring."""\n__version__ = "1"\n', None),
        (
            '__all__ = ["F", "G"]\ndef F(): pass\n',
            "__all__ names ['G'] that the module does not define",
        ),
        ('__all__ = ["F", "F"]\ndef F(): pass\n', "__all__ lists ['F'] twice"),
        ("__all__ = NAMES\n", "__all__ is not a literal list of strings"),
        (
            "from x import y as F\ntry:\n    G = 1\nexcept E:\n    H = 2\n"
            '__all__ = ["F", "G", "H"]\n',
            None,
        ),
    ],
)
def test_the_check_itself(source, error):
    assert SurfaceError(source) == error


def test_every_public_module_declares_its_surface():
    problems = {
        name: error
        for name, path in PUBLIC.items()
        if name not in _SHIMS and (error := SurfaceError(path.read_text()))
    }
    assert not problems, "\n".join(f"{n}: {e}" for n, e in sorted(problems.items()))
