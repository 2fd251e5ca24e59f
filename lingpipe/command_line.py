"""What lingpipe's commands share: bad input on the command line ends with one line on
stderr, `<command>: error: <what was received and what was expected>`, and exit status 2,
not a usage block or a traceback.

    parser = command_line.ArgumentParser("lingpipe.pipeline.schedules")  # argparse
    app.run(main, flags_parser=command_line.AbslParser("lingpipe.demo"))  # absl flags
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

__all__ = [
    "AbslParser",
    "ArgumentParser",
]


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser for `python -m <command>`, its errors one line (module doc)."""

    def __init__(self, command: str, error_prefix: str | None = None, **kwargs) -> None:
        super().__init__(prog=f"python -m {command}", **kwargs)
        self._error_prefix = f"{command}: error:" if error_prefix is None else error_prefix

    def error(self, message: str) -> NoReturn:
        print(f"{self._error_prefix} {message}", file=sys.stderr)
        sys.exit(2)


def AbslParser(command: str) -> Callable[[list[str]], list[str]]:
    """absl.app.run's flags_parser for `command`: a bad flag is one line (module doc);
    --help (or --helpfull) prints the help and exits 0."""
    from absl import flags

    def Parse(argv: list[str]) -> list[str]:
        try:
            return flags.FLAGS(argv)
        except flags.Error as e:
            print(f"{command}: error: {e} (see --help)", file=sys.stderr)
            sys.exit(2)
        except SystemExit as e:
            # Parsing exits by itself only once --help has printed the help: a success.
            sys.exit(0 if e.code == 1 else e.code)

    return Parse
