"""Moves lingpipe's modules to the layout that shows the engine, and rewrites every reference.

    python tools/relayout.py            # on a clean checkout, from anywhere inside it
    python tools/relayout.py --dry-run  # says what it would move, changes nothing

What it does, in order (each step is skipped where it is already done, so a second run
moves only what was added since and rewrites only what still names an old path):

1. `lingpipe/pipeline/*.py` into subpackages by kind (PIPELINE below): `step/` runs a
   training step, `schedules/` holds schedules as data, `planning/` chooses stages and
   plans, `observe/` looks at a run. A module of lingpipe/pipeline/ that PIPELINE does not
   name stops the script before anything changes: add its line and run it again.
2. `lingpipe/schedules.py` (learning-rate schedules) to `lingpipe/lr_schedules.py`, with a
   shim at the old path that warns and hands out the new module.
3. The top-level `params/` package (lingpipe's registered model params) to
   `lingpipe/params/`, so that a wheel installs no top-level package but `lingpipe`.
4. `python -m lingpipe.pipeline.schedule` becomes `python -m lingpipe.pipeline.schedules`
   (the package's `__main__.py`), which closes no import loop: schedule.py's `__main__`
   block imported the command, which imports schedule.py.
5. Every reference in the tracked text files (Python, Markdown, TOML, YAML, shell, ...):
   imports (`from lingpipe.pipeline import a, b` is split by subpackage), dotted module
   paths in code and strings, file paths, `python -m` commands, and the modules' local
   names where a name changed (`schedules.` -> `lr_schedules.`, `schedule_cli.` -> `cli.`).
   Only exact, anchored patterns (below) are rewritten; a line holding `relayout: keep` and
   the files in KEEP are left as they are.
6. ruff sorts the imports of the Python files it changed and formats them.
7. A last scan fails, listing file:line, on any old path still left (a dynamic one such as
   f"lingpipe.pipeline.{name}" included): fix those by hand.

It stages everything with git (git mv for moves) and commits nothing.
Exit status: 0 done, 2 refused (a dirty tree, an unknown module, a leftover), listed.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import shutil
import subprocess
import sys

# lingpipe/pipeline/<name>.py -> lingpipe/pipeline/<path>.py. One line per module.
PIPELINE = {
    # Running a training step.
    "driver": "step/driver",
    "settings": "step/settings",
    "executor": "step/executor",
    "gradient_sums": "step/gradient_sums",
    "micro_batch": "step/micro_batch",
    "placement": "step/placement",
    "precision": "step/precision",
    "remat": "step/remat",
    "stage_context": "step/stage_context",
    "xla": "step/xla",
    # Schedules as data.
    "actions": "schedules/actions",
    "controllable_memory": "schedules/controllable_memory",
    "generators": "schedules/generators",
    "schedule": "schedules/schedule",
    "schedule_cli": "schedules/cli",
    "simulate": "schedules/simulate",
    # Planning: stages, costs, the stages table, the plan search.
    "costs": "planning/costs",
    "partition": "planning/partition",
    "planner": "planning/planner",
    "report": "planning/report",
    "calibrate": "planning/calibrate",
    "cell_times": "planning/cell_times",
    "cost_model": "planning/cost_model",
    # Looking at a run.
    "memory": "observe/memory",
    "plot": "observe/plot",
    "timeline": "observe/timeline",
}

SUBPACKAGES = {
    "step": "Running a training step: micro-batches, the executor that creates each action's\n"
    "ops in the schedule's order, recomputation, stage devices, precision, gradient sums, XLA.",
    "schedules": "Pipeline schedules as data: the actions, torch's CSV format, the schedules by\n"
    "name, the simulation, and `python -m lingpipe.pipeline.schedules`.",
    "planning": "Planning: cutting the cells into stages, their costs, the stages table, and\n"
    "the search for a plan.",
    "observe": "Looking at a run: the memory estimate, the measured timeline, and pictures.",
}

# `python -m <old>` -> `python -m <new>`.
COMMANDS = {
    "lingpipe.pipeline.schedule": "lingpipe.pipeline.schedules",
    "lingpipe.pipeline.schedule_cli": "lingpipe.pipeline.schedules",
}

SCHEDULE_MAIN = """if __name__ == "__main__":
    from lingpipe.pipeline import schedule_cli

    raise SystemExit(schedule_cli.main())
"""

SCHEDULES_MAIN_PY = '''
"""`python -m lingpipe.pipeline.schedules`: a schedule's grid, bubble and peak alive (cli)."""

if __name__ == "__main__":
    from lingpipe.pipeline.schedules import cli

    raise SystemExit(cli.main())
'''.lstrip()

LR_SHIM = '''"""Moved: the learning-rate schedules are `lingpipe.lr_schedules` now.

This path still imports, for one release, and warns; it is the same module object.
"""

import sys
import warnings

from lingpipe import lr_schedules

warnings.warn(
    "lingpipe.schedules moved to lingpipe.lr_schedules; import it from there (the old "
    "path goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = lr_schedules
'''

# Files whose old names are deliberate: the compatibility code, its tests, this script and
# its test, and the changelog's history.
KEEP = {
    "CHANGELOG.md",
    "lingpipe/_moved.py",
    "lingpipe/pipeline/__init__.py",
    "lingpipe/schedules.py",
    "tests/test_moved_paths.py",
    "tests/test_relayout.py",
    "tools/relayout.py",
}
KEEP_MARK = "relayout: keep"
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yml", ".yaml", ".cfg", ".ini", ".txt", ".sh", ".rst"}
TEXT_NAMES = {"run", "Makefile", "setup.cfg"}


class Refused(Exception):
    """The script stops: each argument is one line to print."""


def Git(root: pathlib.Path, *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if result.returncode != 0:
        raise Refused(f"git {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


# ---- moving files --------------------------------------------------------------------


def PlanMoves(root: pathlib.Path) -> list[tuple[str, str]]:
    """(old path, new path) for every file still to move; refuses an unknown module."""
    moves = []
    flat = sorted(p.stem for p in (root / "lingpipe/pipeline").glob("*.py"))
    unknown = [name for name in flat if name != "__init__" and name not in PIPELINE]
    if unknown:
        raise Refused(
            *[
                f"lingpipe/pipeline/{n}.py: no destination in tools/relayout.py PIPELINE"
                for n in unknown
            ],
            'add a line for each (e.g. "settings": "step/settings") and run it again',
        )
    for name in flat:
        if name != "__init__":
            moves.append((f"lingpipe/pipeline/{name}.py", f"lingpipe/pipeline/{PIPELINE[name]}.py"))
    if not (root / "lingpipe/lr_schedules.py").exists():
        moves.append(("lingpipe/schedules.py", "lingpipe/lr_schedules.py"))
    if (root / "tests/test_schedules.py").exists():  # Tests mirror the package.
        moves.append(("tests/test_schedules.py", "tests/test_lr_schedules.py"))
    if (root / "params").is_dir():
        tracked = Git(root, "ls-files", "params").split()
        moves += [(path, f"lingpipe/{path}") for path in sorted(tracked)]
    clashes = [new for _, new in moves if (root / new).exists()]
    if clashes:
        raise Refused(
            *[f"{new}: already exists; expected nothing at a move's target" for new in clashes]
        )
    return moves


def Move(root: pathlib.Path, moves: list[tuple[str, str]]) -> None:
    for old, new in moves:
        (root / new).parent.mkdir(parents=True, exist_ok=True)
        Git(root, "mv", old, new)
    for name, doc in SUBPACKAGES.items():
        init = root / "lingpipe/pipeline" / name / "__init__.py"
        if (root / init.parent).is_dir() and not init.exists():
            init.write_text(f'"""{doc}"""\n')
            Git(root, "add", str(init.relative_to(root)))
    if not (root / "lingpipe/schedules.py").exists():
        (root / "lingpipe/schedules.py").write_text(LR_SHIM)
        Git(root, "add", "lingpipe/schedules.py")
        lr = root / "lingpipe/lr_schedules.py"
        text = lr.read_text()
        lr.write_text(text.replace("    schedule = schedules.", "    schedule = lr_schedules."))
    schedule = root / "lingpipe/pipeline/schedules/schedule.py"
    main = root / "lingpipe/pipeline/schedules/__main__.py"
    text = schedule.read_text()
    if SCHEDULE_MAIN in text:
        schedule.write_text(text.replace("\n\n" + SCHEDULE_MAIN, "\n"))
    elif "__main__" in text:
        raise Refused(f"{schedule.relative_to(root)}: its __main__ block is not the one expected")
    if not main.exists():
        main.write_text(SCHEDULES_MAIN_PY)
        Git(root, "add", str(main.relative_to(root)))


# ---- rewriting references ----------------------------------------------------------------


def _Dotted(path: str) -> str:
    return path.replace("/", ".")


def Rules(params_modules: list[str]) -> list[tuple[re.Pattern, object]]:
    """The rewrites, in order: (pattern, replacement) for re.sub on each line."""
    old = "|".join(sorted(PIPELINE, key=len, reverse=True))
    rules: list[tuple[re.Pattern, object]] = []
    for before, after in COMMANDS.items():
        name = re.escape(before)
        rules += [
            (re.compile(rf"(python -m |\"-m\", \"|'-m', '){name}\b(?!\.\w)"), rf"\g<1>{after}"),
            (re.compile(rf"(?<![\w.]){name}: error:"), f"{after}: error:"),
        ]
    rules += [
        # Dotted paths in code, strings and prose.
        (
            re.compile(rf"(?<![\w.])lingpipe\.pipeline\.({old})\b"),
            lambda m: f"lingpipe.pipeline.{_Dotted(PIPELINE[m.group(1)])}",
        ),
        # File paths, with or without the lingpipe/ prefix.
        (
            re.compile(rf"(?<![\w/.-])((?:lingpipe/)?pipeline/)({old})\.py\b"),
            lambda m: f"{m.group(1)}{PIPELINE[m.group(2)]}.py",
        ),
        (re.compile(r"(?<![\w.])lingpipe\.schedules\b"), "lingpipe.lr_schedules"),
        (re.compile(r"(?<![\w/.-])lingpipe/schedules\.py\b"), "lingpipe/lr_schedules.py"),
        # The params package.
        (re.compile(r"^(\s*)import params$"), r"\1from lingpipe import params"),
        (re.compile(r"\bimport sys, params;"), "import sys; from lingpipe import params;"),
        (
            re.compile(r"(?<![\w.])from params((?:\.\w+)*) import\b"),
            r"from lingpipe.params\1 import",
        ),
    ]
    if params_modules:
        names = "|".join(sorted(params_modules, key=len, reverse=True))
        rules += [
            (re.compile(rf"(?<![\w/.-])params/({names})\.py\b"), r"lingpipe/params/\1.py"),
            (re.compile(rf"(?<![\w.])params\.({names})\b"), r"lingpipe.params.\1"),
        ]
    return rules


_FROM_PIPELINE = re.compile(
    r"^(?P<indent>[ \t]*)from lingpipe\.pipeline import "
    r"(?:\((?P<group>[^)]*)\)|(?P<line>[^\n(]+?))[ \t]*$",
    re.MULTILINE,
)


def SplitPipelineImports(text: str, where: str) -> str:
    """`from lingpipe.pipeline import a, b as c` -> one import per subpackage."""

    def One(m: re.Match) -> str:
        body = m.group("group") if m.group("group") is not None else m.group("line")
        body, hash_, comment = body.partition("#")  # A trailing comment stays on line one.
        comment = f"  #{comment.rstrip()}" if hash_ else ""
        items = [i.strip() for i in body.replace("\n", " ").split(",") if i.strip()]
        by_package: dict[str, list[str]] = {}
        for item in items:
            name, _, alias = (p.strip() for p in item.partition(" as "))
            if name in SUBPACKAGES or name == "*":
                by_package.setdefault("", []).append(item)
                continue
            if name not in PIPELINE:
                raise Refused(
                    f"{where}: imports lingpipe.pipeline.{name}, which PIPELINE does not name"
                )
            package, _, new = PIPELINE[name].rpartition("/")
            local = alias or new  # A renamed module's users take its new name (RenameLocals).
            by_package.setdefault(package, []).append(new if local == new else f"{new} as {local}")
        lines = []
        for package in sorted(by_package):
            source = f"lingpipe.pipeline.{package}" if package else "lingpipe.pipeline"
            lines.append(
                f"{m.group('indent')}from {source} import {', '.join(by_package[package])}"
            )
        lines[0] += comment
        return "\n".join(lines)

    return _FROM_PIPELINE.sub(One, text)


_FROM_LINGPIPE = re.compile(
    r"^(?P<head>[ \t]*from lingpipe import )(?P<names>[^\n(]+)$", re.MULTILINE
)
# Modules whose local name changes with the move: (old local name, new local name, the
# import that brings the new one).
RENAMED_LOCALS = [
    ("schedules", "lr_schedules", re.compile(r"^\s*from lingpipe import .*\blr_schedules\b", re.M)),
    (
        "schedule_cli",
        "cli",
        re.compile(r"^\s*from lingpipe\.pipeline\.schedules import .*\bcli\b(?! as)", re.M),
    ),
]


def RenameLocals(text: str) -> str:
    """`from lingpipe import schedules` -> `lr_schedules`, and `schedules.X` after it; the
    same for the command module's local name `schedule_cli`."""

    def Names(m: re.Match) -> str:
        body, hash_, comment = m.group("names").partition("#")
        names = [n.strip() for n in body.split(",")]
        new = ", ".join("lr_schedules" if n == "schedules" else n for n in names)
        return m.group("head") + new + (f"  #{comment}" if hash_ else "")

    text = _FROM_LINGPIPE.sub(Names, text)
    for before, after, imported in RENAMED_LOCALS:
        if imported.search(text):
            text = re.sub(rf"(?<![\w.]){before}\.(?=[A-Za-z_])", f"{after}.", text)
    return text


def IsText(path: str) -> bool:
    p = pathlib.PurePath(path)
    return p.suffix in TEXT_SUFFIXES or p.name in TEXT_NAMES


def Rewrite(root: pathlib.Path, rules: list, text: str, where: str) -> str:
    text = SplitPipelineImports(text, where)
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if KEEP_MARK in line:
            continue
        for pattern, replacement in rules:
            line = pattern.sub(replacement, line)
        lines[i] = line
    return RenameLocals("\n".join(lines))


def Leftovers(root: pathlib.Path, files: list[str]) -> list[str]:
    old = "|".join(PIPELINE)
    patterns = [
        re.compile(rf"(?<![\w.])lingpipe\.pipeline\.({old})\b"),
        re.compile(rf"(?<![\w/.-])(lingpipe/)?pipeline/({old})\.py\b"),
        re.compile(r"lingpipe\.pipeline\.\{"),
        re.compile(r"(?<![\w.])lingpipe\.schedules\b"),
        re.compile(r"^\s*(import params$|from params\b)"),
        re.compile(r"^\s*from lingpipe import [^\n]*\bschedules\b"),
    ]
    found = []
    for path in files:
        for n, line in enumerate((root / path).read_text().splitlines(), start=1):
            if KEEP_MARK not in line and any(p.search(line) for p in patterns):
                found.append(f"{path}:{n}: {line.strip()}")
    return found


def Main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/relayout.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--dry-run", action="store_true", help="print the moves, change nothing")
    args = parser.parse_args(argv)
    root = pathlib.Path(__file__).resolve().parent.parent
    try:
        if shutil.which("ruff") is None:
            raise Refused("ruff is not on PATH; expected it installed (pip install ruff)")
        if Git(root, "status", "--porcelain").strip() and not args.dry_run:
            raise Refused(
                "the working tree has changes; expected a clean checkout (commit or drop them)"
            )
        moves = PlanMoves(root)
        for old, new in moves:
            print(f"move {old} -> {new}")
        if args.dry_run:
            return 0
        params_modules = sorted(
            pathlib.PurePath(new).stem
            for old, new in moves
            if old.startswith("params/") and new.endswith(".py")
        ) or sorted(p.stem for p in (root / "lingpipe/params").glob("*.py") if p.stem != "__init__")
        Move(root, moves)
        rules = Rules(params_modules)
        files = sorted(f for f in Git(root, "ls-files").splitlines() if IsText(f) and f not in KEEP)
        changed = []
        for path in files:
            before = (root / path).read_text()
            after = Rewrite(root, rules, before, path)
            if after != before:
                (root / path).write_text(after)
                changed.append(path)
        new = Git(root, "diff", "--cached", "--name-only", "--diff-filter=A").split()
        python = sorted({p for p in [*changed, *new] if p.endswith(".py")})
        if python:
            subprocess.run(
                ["ruff", "check", "--select", "I", "--fix", "-q", *python], cwd=root, check=False
            )
            subprocess.run(["ruff", "format", "-q", *python], cwd=root, check=True)
            long = subprocess.run(
                ["ruff", "check", "--select", "E501", "--output-format", "concise", *python],
                cwd=root,
                capture_output=True,
                text=True,
            ).stdout.splitlines()
            for line in [x for x in long if "E501" in x]:
                print(f"relayout: shorten by hand (a longer path in a string): {line}")
        Git(root, "add", "-A")
        print(f"rewrote {len(changed)} files")
        left = Leftovers(root, files)
        if left:
            raise Refused("old paths left, which no rule rewrites (fix them by hand):", *left)
    except Refused as e:
        print("\n".join(f"relayout: {line}" for line in e.args), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(Main())
