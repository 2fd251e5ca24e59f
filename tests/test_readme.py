"""The Python blocks of README.md and of the guides in docs/ run as printed, each alone
in a fresh Python process on a CPU-only machine (no GPU is made visible), so that a new
user can paste any of them. A block printed on several pages (README's screens repeat
the guides') runs once.

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

import glob
import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))
)
TIMEOUT_S = 180
_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
_FILE = re.compile(r"#\s*((?:\w+/)*\w+)\.py\s*$")
_NOT_RUN = re.compile(r"#\s*readme:\s*not run\s*\((.+)\)")


class Block:
    """One ```python block: its text, page, first line number and section."""

    def __init__(self, text: str, line: int, section: str, page: str = "README.md") -> None:
        self.text, self.line, self.section = textwrap.dedent(text), line, section
        self.page = page
        self.also: list[str] = []  # other places that print the same block

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def id(self) -> str:
        words = re.sub(r"[^A-Za-z0-9]+", "_", self.section).strip("_").lower()
        page = re.sub(r"[^A-Za-z0-9]+", "_", os.path.splitext(self.page)[0]).lower()
        return f"{page}_line{self.line}_{words[:30]}"


def Blocks(markdown: str, page: str = "README.md") -> list[Block]:
    """Every ```python block of `markdown`, in order."""
    blocks = []
    for match in _FENCE.finditer(markdown):
        before = markdown[: match.start()]
        sections = re.findall(r"^#{1,2} (.+)$", before, re.M)
        line = before.count("\n") + 2  # the block's first line, 1-based
        blocks.append(Block(match.group(1), line, sections[-1] if sections else "top", page))
    return blocks


def Unique(blocks: list[Block]) -> list[Block]:
    """The blocks with distinct text, each noting where else it is printed."""
    first: dict[str, Block] = {}
    for block in blocks:
        if block.text in first:
            first[block.text].also.append(block.where)
        else:
            first[block.text] = block
    return list(first.values())


def _PageBlocks() -> list[Block]:
    blocks = []
    for page in PAGES:
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            blocks += Blocks(f.read(), page)
    return blocks


ALL_BLOCKS = _PageBlocks()
BLOCKS = Unique(ALL_BLOCKS)


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


def test_the_same_block_on_two_pages_runs_once():
    one = Blocks("## A\n```python\nx = 1\n```\n", "README.md")
    two = Blocks("# Guide\n\n```python\nx = 1\n```\n```python\ny = 2\n```\n", "docs/g.md")
    unique = Unique(one + two)
    assert [(b.where, b.also) for b in unique] == [
        ("README.md:3", ["docs/g.md:4"]),
        ("docs/g.md:7", []),
    ]
    assert unique[1].id == "docs_g_line7_guide"


def test_readme_and_every_guide_with_code_have_their_blocks_found():
    pages = {b.page for b in ALL_BLOCKS}
    for page in ("README.md", "docs/pipeline.md", "docs/keras.md", "docs/schedules.md"):
        assert page in pages, sorted(pages)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_readme_block_runs_as_printed(block, tmp_path):
    not_run = _NOT_RUN.search(block.text)
    if not_run:
        compile(block.text, block.where, "exec")
        pytest.skip(f"{block.where} is marked not run ({not_run.group(1)})")
    done = subprocess.run(
        _Command(block, str(tmp_path)),
        cwd=tmp_path,
        env=_Env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, (
        f"{block.where} (section {block.section!r}; also at {block.also}) failed with exit "
        f"{done.returncode}:\n{block.text}\n--- stderr (end) ---\n{done.stderr[-3000:]}"
    )
