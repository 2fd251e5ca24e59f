"""README.md's Python blocks run as printed, each alone in a fresh Python process on a
CPU-only machine (no GPU is made visible), so that a new user can paste any of them.

A block runs as a script, with the checkout first on PYTHONPATH and a fresh
working directory. Two comments on a block's first line change that:

    # params/mymodels.py           the block is that file: it is written there (with
                                   the packages' __init__.py) and imported
    # readme: not run (needs a TPU)  the block cannot run anywhere without what the
                                   parentheses name; it is only checked to compile

Keep the second rare: a block that needs N pipeline devices calls
`lingpipe.cluster.SetLogicalCpuDevices(N)` first and runs on CPU.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
TIMEOUT_S = 180
_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
_FILE = re.compile(r"#\s*((?:\w+/)*\w+)\.py\s*$")
_NOT_RUN = re.compile(r"#\s*readme:\s*not run\s*\((.+)\)")


class Block:
    """One ```python block: its text, first line number and README section."""

    def __init__(self, text: str, line: int, section: str) -> None:
        self.text, self.line, self.section = textwrap.dedent(text), line, section

    @property
    def id(self) -> str:
        words = re.sub(r"[^A-Za-z0-9]+", "_", self.section).strip("_").lower()
        return f"line{self.line}_{words[:30]}"


def Blocks(markdown: str) -> list[Block]:
    """Every ```python block of `markdown`, in order."""
    blocks = []
    for match in _FENCE.finditer(markdown):
        before = markdown[: match.start()]
        sections = re.findall(r"^## (.+)$", before, re.M)
        line = before.count("\n") + 2  # the block's first line, 1-based
        blocks.append(Block(match.group(1), line, sections[-1] if sections else "top"))
    return blocks


with open(README, encoding="utf-8") as _f:
    BLOCKS = Blocks(_f.read())


def _Env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    env = dict(os.environ, PYTHONPATH=ROOT + (os.pathsep + path if path else ""))
    env["CUDA_VISIBLE_DEVICES"] = ""  # as on a CPU-only machine
    return env


def _Command(block: Block, cwd: str) -> list[str]:
    """The command that runs `block` in `cwd` (writing its file first, for a file block)."""
    first = block.text.splitlines()[0] if block.text.strip() else ""
    match = _FILE.fullmatch(first.strip())
    if match is None:
        return [sys.executable, "-c", block.text]
    module = match.group(1).split("/")
    for i in range(1, len(module)):
        package = os.path.join(cwd, *module[:i])
        os.makedirs(package, exist_ok=True)
        open(os.path.join(package, "__init__.py"), "a").close()
    with open(os.path.join(cwd, *module) + ".py", "w") as f:
        f.write(block.text)
    return [sys.executable, "-c", f"import {'.'.join(module)}"]


def test_readme_has_python_blocks_and_the_parser_finds_each():
    markdown = (
        "## A\n\n```python\nx = 1\n```\n\ntext\n```\nshell\n```\n## B\n```python\n  y = 2\n```\n"
    )
    found = Blocks(markdown)
    assert [(b.text, b.line, b.section) for b in found] == [
        ("x = 1\n", 4, "A"),
        ("y = 2\n", 13, "B"),
    ]
    assert len(BLOCKS) >= 5, [b.id for b in BLOCKS]


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_readme_block_runs_as_printed(block, tmp_path):
    not_run = _NOT_RUN.search(block.text)
    if not_run:
        compile(block.text, f"README.md:{block.line}", "exec")
        pytest.skip(f"README.md:{block.line} is marked not run ({not_run.group(1)})")
    done = subprocess.run(
        _Command(block, str(tmp_path)),
        cwd=tmp_path,
        env=_Env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, (
        f"README.md line {block.line} (section {block.section!r}) failed with exit "
        f"{done.returncode}:\n{block.text}\n--- stderr (end) ---\n{done.stderr[-3000:]}"
    )
