"""Paths that TensorFlow reads as glob patterns, refused before anything is written.

    problem = glob_paths.Refusal('runs/lr[0.1]', '--logdir=runs/lr[0.1]', flag='--logdir')
    if problem:
        raise UsageError(problem)   # '' for a path TensorFlow handles like any other

TensorFlow finds a checkpoint's files by matching its path as a glob (C++
`GetMatchingPaths`), in its own loaders as in its checkpoint manager (measured with
TF 2.21):

- `tf.saved_model.load`, `tf.train.load_checkpoint` and `tf.train.Checkpoint.restore`
  find no files under a directory named `lr[0.1]` (`[0.1]` matches one character) or
  one holding a backslash ("Failed to find any matching files for
  .../variables/variables");
- `tf.train.CheckpointManager` deletes an old checkpoint by glob, so under `runs/lr?`
  or `runs/lr*` it also deletes the same-numbered checkpoints of `runs/lr1`,
  `runs/lrx`, ...

Reading such a run through a glob-free symlink would serve lingpipe alone, not the
user's own TensorFlow tools, so a run, checkpoint or export directory whose path
holds `[`, `]`, `*`, `?` or `\\` is refused with one line that names a path that works.
"""

from __future__ import annotations

import os
import re

__all__ = [
    "GLOB_CHARS",
    "Refusal",
]

# The characters of TensorFlow's glob syntax (tsl's kGlobbingChars, and ']').
GLOB_CHARS = re.compile(r"[][*?\\]")

_EXPECTED = "expected a path without '[', ']', '*', '?' or '\\'"
_WHY = (
    "TensorFlow reads checkpoint and SavedModel paths as glob patterns: under such a name "
    "its loaders find no files, or its checkpoint manager deletes other runs' checkpoints"
)


def _Renamed(path: str) -> str:
    """`path` with the glob characters left out (brackets) or made '_' (the others), and
    a number added if a local path of that name exists (another run's, say)."""
    renamed = re.sub(r"[*?\\]", "_", re.sub(r"[][]", "", path.rstrip("/")))
    if "://" in renamed or not os.path.exists(os.path.expanduser(renamed)):
        return renamed
    number = 2
    while os.path.exists(os.path.expanduser(f"{renamed}-{number}")):
        number += 1
    return f"{renamed}-{number}"


def Refusal(path: str, what: str, flag: str | None = None) -> str:
    """'' if TensorFlow reads and writes checkpoints and SavedModels under `path` as it
    does under any name; otherwise one line that starts with `what`, says why, and names
    a path to use instead (as `flag=PATH` when a flag gave it).

    A local path is checked whole (absolute, `~` expanded): a relative one inherits the
    glob characters of the working directory's path.
    """
    full = path if "://" in path else os.path.abspath(os.path.expanduser(path))
    if not GLOB_CHARS.search(full):
        return ""
    if not GLOB_CHARS.search(path):
        return (
            f"{what}: {_EXPECTED}, received {full} ({_WHY}); run from a directory whose path "
            "has none of them, or give an absolute path without them"
        )
    instead = _Renamed(path)
    if "://" not in path and os.path.exists(full):
        fix = f"rename it, e.g. to {instead}" + (
            f", and rerun with {flag}={instead}" if flag else ""
        )
    else:
        fix = "choose another name, e.g. " + (f"{flag}={instead}" if flag else instead)
    return f"{what}: {_EXPECTED} ({_WHY}); {fix}"
