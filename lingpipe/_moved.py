"""Old module paths that still work for one release, saying where the module went.

`Install(package, moved, commands)` makes `import <package>.<old>`, `from <package>
import <old>` and `from <package>.<old> import name` reach the module at its new path,
with a DeprecationWarning that names it. The old name is the same module object as
the new one, so patching through either path patches both. `python -m <package>.<old>`
runs the new command (`commands`), saying on stderr that it moved.

A module that still exists at its old path in the package's folder is imported as
usual: the alias applies only when the package's own folder has no such module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Mapping

__all__ = ["Install"]


class _Loader(importlib.abc.Loader):
    """Loads an old name as the module at its new path."""

    def __init__(self, old: str, new: str, command: str) -> None:
        self._old, self._new, self._command = old, new, command

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        warnings.warn(
            f"{self._old} moved to {self._new}; import it from there (the old path goes "
            "away in the next release)",
            DeprecationWarning,
            stacklevel=2,  # The frames of Python's import system are skipped.
        )
        return importlib.import_module(self._new)

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the module ran when it was imported under its new name."""

    def get_code(self, fullname: str) -> types.CodeType:
        """The code `python -m <old>` runs: the new command's."""
        print(
            f"python -m {self._old} moved to python -m {self._command} (the old command "
            "goes away in the next release)",
            file=sys.stderr,
        )
        spec = importlib.util.find_spec(self._command)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(f"{self._command}.__main__")
        return spec.loader.get_code(spec.name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the old names of one package's moved modules."""

    def __init__(self, package: str, moved: Mapping[str, str], commands: Mapping[str, str]):
        self.package, self._moved, self._commands = package, dict(moved), dict(commands)

    def find_spec(self, fullname, path=None, target=None):
        parent, _, name = fullname.rpartition(".")
        if parent != self.package or name not in self._moved:
            return None
        here = sys.modules[self.package].__path__
        if importlib.machinery.PathFinder.find_spec(fullname, here) is not None:
            return None  # Not moved (yet): the module at the old path is the module.
        new = f"{self.package}.{self._moved[name]}"
        loader = _Loader(fullname, new, self._commands.get(name, new))
        return importlib.machinery.ModuleSpec(fullname, loader)


def Install(
    package: str, moved: Mapping[str, str], commands: Mapping[str, str] | None = None
) -> None:
    """Lets the old names of `package`'s moved modules import, with a warning.

    Args:
      package: the package the modules were in, e.g. 'lingpipe.pipeline'.
      moved: {old name: new path below `package`}, e.g. {'schedule': 'schedules.schedule'}.
      commands: {old name: the module `python -m` runs now}, for a module that was a
        command, e.g. {'schedule': 'lingpipe.pipeline.schedules'}; others run their new path.
    """
    if any(isinstance(f, _Finder) and f.package == package for f in sys.meta_path):
        return
    # Ahead of the other finders, so that an editable install's finder, which maps the
    # package to a checkout, cannot find a stale file of the old name there.
    sys.meta_path.insert(0, _Finder(package, moved, commands or {}))
