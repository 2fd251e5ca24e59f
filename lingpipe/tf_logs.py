"""TensorFlow's start-up noise, kept out of the command-line tools' output.

    from lingpipe import tf_logs
    tf_logs.ImportTensorFlow()      # first thing after the flags are checked

Importing TensorFlow 2.21 writes, before its C++ logging is set up (so
`TF_CPP_MIN_LOG_LEVEL` cannot hide them), a banner twice (oneDNN, "Could not find
cuda drivers", the CPU instruction set), and on a machine without a CUDA driver
the first device listing logs `E... failed call to cuInit`. None of it is
something a user can act on. `ImportTensorFlow` imports TensorFlow and lists the
devices with file descriptor 2 redirected to a file, then writes back every line
but those. Later C++ INFO lines go with `TF_CPP_MIN_LOG_LEVEL=1`, set only when
the user has not set it. `QuietPythonWarnings` drops TensorFlow Python log lines
that describe lingpipe's own choices (see `NOISE`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator

__all__ = [
    "BANNER",
    "FilterBanner",
    "ImportTensorFlow",
    "NOISE",
    "QuietPythonWarnings",
]

# Lines of TensorFlow's import banner (each a whole line of stderr).
BANNER = (
    re.compile(r"WARNING: All log messages before absl::InitializeLog\(\) is called are written"),
    re.compile(r"^[IW]\d{4} .*\bport\.cc:\d+\] oneDNN custom operations are on"),
    re.compile(r"^[IW]\d{4} .*\bcudart_stub\.cc:\d+\] Could not find cuda drivers"),
    re.compile(r"^[IW]\d{4} .*\bcpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized"),
    re.compile(r"^To enable the following instructions: .* rebuild TensorFlow"),
)
_NO_DRIVER = re.compile(r"cudart_stub\.cc:\d+\] Could not find cuda drivers")
# Said when no CUDA driver is installed, which the banner's line above already told.
_CU_INIT = re.compile(r"^E\d{4} .*\] failed call to cuInit: ")
# TensorFlow Python log lines about lingpipe's design, not about the user's run:
# under `mirrored` each replica's gradients are reduced onto that replica's own
# copies of the weights (one task per replica), so destinations always differ; and
# connecting to the stage hosts (`hosts`) dumps its SessionOptions proto (20 lines);
# saving a SavedModel (`--mode=export`) reports renaming captured variables' inner
# names and writing its fingerprint file.
NOISE = (
    re.compile(r"^Efficient batch_reduce is not supported if destinations are different"),
    re.compile(r"^default session config: "),
    re.compile(r"^Function `\w+` contains input name\(s\) .* unsupported characters"),
    re.compile(r"^Writing fingerprint to "),
)


def FilterBanner(text: str) -> str:
    """`text` (captured stderr) less TensorFlow's start-up banner lines (see BANNER)."""
    no_driver = _NO_DRIVER.search(text) is not None
    kept = []
    for line in text.splitlines(keepends=True):
        if any(p.search(line) for p in BANNER):
            continue
        if no_driver and _CU_INIT.search(line):
            continue
        kept.append(line)
    return "".join(kept)


@contextlib.contextmanager
def _FilteredStderr() -> Iterator[None]:
    """Within: file descriptor 2 goes to a file; after, its lines less the banner go back."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no file descriptor 2: nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = FilterBanner(capture.read().decode("utf-8", errors="replace"))
            if text:
                sys.stderr.write(text)
                sys.stderr.flush()


def ImportTensorFlow() -> None:
    """Imports TensorFlow and lists its devices without the start-up banner (see the
    module docstring); sets TF_CPP_MIN_LOG_LEVEL=1 (C++ INFO lines off) unless set.

    Lists devices but does not initialize them: logical CPU devices can still be set.
    """
    if "tensorflow" in sys.modules:
        return  # too late; and a process that imported it (a test) keeps its environment
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    with _FilteredStderr():
        import tensorflow as tf

        tf.config.list_physical_devices()
    QuietPythonWarnings()


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(p.search(message) for p in NOISE)


def QuietPythonWarnings() -> None:
    """Drops the lines of NOISE from TensorFlow's Python logger and absl's (which some of
    TensorFlow's modules log to), once per process."""
    import tensorflow as tf
    from absl import logging as absl_logging

    for logger in (tf.get_logger(), absl_logging.get_absl_logger()):
        if not any(isinstance(f, _DropNoise) for f in logger.filters):
            logger.addFilter(_DropNoise())
