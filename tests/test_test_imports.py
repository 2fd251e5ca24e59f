"""Test files share helpers through helper modules (tests/runners/trainer_runs.py,
tests/pipeline/gpipe_cells.py, ...), never by importing another test_*.py file:
that runs the other file's module-level code and ties its private names to it."""

import ast
import pathlib

TESTS = pathlib.Path(__file__).parent


def _ImportedModules(tree):
    """(line, module name) of every import in `tree`, at any depth (in functions too)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.lineno, node.module


def CrossImports(root):
    """'path:line imports test_x' for each import of a test_*.py module under `root`."""
    test_modules = {path.stem for path in root.rglob("test_*.py")}
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, module in _ImportedModules(tree):
            if module.split(".")[0] in test_modules:
                found.append(f"{path.relative_to(root)}:{line} imports {module}")
    return found


def test_no_test_file_imports_another_test_file():
    assert CrossImports(TESTS) == []


def test_the_check_sees_imports_at_any_depth(tmp_path):
    (tmp_path / "test_a.py").write_text("X = 1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "test_b.py").write_text(
        "import os\nfrom helpers import Y\n\ndef f():\n    from test_a import X\n"
    )
    (tmp_path / "helpers.py").write_text("import test_a\n")
    assert CrossImports(tmp_path) == [
        "helpers.py:1 imports test_a",
        "sub/test_b.py:5 imports test_a",
    ]
