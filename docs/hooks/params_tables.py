"""MkDocs hook: `<!-- params: lingpipe.layers.gpipe.PipeliningLayer -->` in a page becomes
the table of that class's params (name, default, description), read statically from the
`p.Define(...)` calls of its `Params()` and of its bases' (with griffe, as mkdocstrings
reads the docstrings), so the reference lists what `Params()` really defines."""

from __future__ import annotations

import ast
import re
from typing import Any

import griffe

_MARKER = re.compile(r"<!--\s*params:\s*([\w.]+)\s*-->")


def ParamsRows(dotted: str, search_path: str = ".") -> list[tuple[str, str, str, str]]:
    """(name, default, description, defined by) of each param, base classes' first."""
    module_name, class_name = dotted.rsplit(".", 1)
    loader = griffe.GriffeLoader(search_paths=[search_path])
    module = loader.load(module_name)
    loader.resolve_aliases(implicit=False, external=None)
    rows: dict[str, tuple[str, str, str, str]] = {}
    for cls in reversed(_Lineage(module[class_name])):
        for name, default, description in _Defines(cls):
            rows[name] = (name, default, description, cls.name)
    return list(rows.values())


def _Lineage(cls: Any) -> list[Any]:
    """The class and its bases that griffe can resolve, nearest first."""
    found = [cls]
    for base in cls.resolved_bases:
        found += [c for c in _Lineage(base) if c not in found]
    return found


def _Defines(cls: Any) -> list[tuple[str, str, str]]:
    method = cls.members.get("Params")
    if method is None:
        return []
    tree = ast.parse(_Dedent(method.lines))
    out = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "Define"
            and len(node.args) >= 3
            and isinstance(node.args[0], ast.Constant)
        ):
            description = node.args[2]
            text = description.value if isinstance(description, ast.Constant) else "?"
            out.append((node.args[0].value, ast.unparse(node.args[1]), text))
        elif _IsSettingDefine(node):
            from lingpipe.pipeline.step import settings  # plain Python, no TensorFlow

            s = settings.Get(node.args[1].value)
            out.append((s.name, repr(s.default), s.doc))
    return out


def _IsSettingDefine(node: ast.AST) -> bool:
    """`settings.Define(p, 'name')`: a pipeline setting, declared in
    lingpipe.pipeline.step.settings (its default and doc are read from there)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "Define"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "settings"
        and len(node.args) == 2
        and isinstance(node.args[1], ast.Constant)
    )


def _Dedent(lines: list[str]) -> str:
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines)


def Table(dotted: str, search_path: str = ".") -> str:
    rows = ["| param | default | what | defined by |", "|---|---|---|---|"]
    for name, default, description, owner in ParamsRows(dotted, search_path):
        cell = description.replace("|", "\\|")
        rows.append(f"| `{name}` | `{default}` | {cell} | `{owner}` |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return _MARKER.sub(lambda m: Table(m.group(1)), markdown)
