"""The previous release's module paths still work, for one release, and say where they went.

They run in new processes: a module's old name warns on its first import only.
"""

import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

from lingpipe import _moved
from lingpipe.pipeline import _MOVED

REPO = pathlib.Path(__file__).resolve().parent.parent


def _Python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


# One process (TensorFlow is imported once) checks the import paths, in this order: each
# old engine path's first import, the other import forms, a params file naming the old
# learning-rate module (before anything imports it), then that module itself.
_OLD_PATHS = """
    import importlib, json, sys, warnings
    from lingpipe.pipeline import _MOVED

    def Warnings(do):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = do()
        return module, [str(w.message) for w in caught if w.category is DeprecationWarning]

    out = {"paths": {}}
    for old in sorted(_MOVED):
        module, warned = Warnings(lambda: importlib.import_module(f"lingpipe.pipeline.{old}"))
        out["paths"][old] = [module.__name__, warned]

    from lingpipe.pipeline import schedule as old
    from lingpipe.pipeline.executor import Run
    import lingpipe.pipeline.memory
    from lingpipe.pipeline.schedules import schedule
    from lingpipe.pipeline.step import executor
    from lingpipe.pipeline.observe import memory
    out["forms"] = [old is schedule, Run is executor.Run, lingpipe.pipeline.memory is memory]

    from lingpipe import hyperparams, lr_schedules
    p = hyperparams.Params()
    p.Define("lr_schedule", lr_schedules.Cosine.Params(), "The schedule.")
    p.FromText("lr_schedule.cls : lingpipe.schedules.Constant")
    out["params_file"] = [p.lr_schedule.cls is lr_schedules.Constant,
                          "lingpipe.schedules" in sys.modules]

    shim, warned = Warnings(lambda: importlib.import_module("lingpipe.schedules"))
    out["shim"] = [shim is lr_schedules, warned]
    print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def old_paths() -> dict:
    run = _Python(_OLD_PATHS)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def test_every_old_engine_path_is_the_new_module_and_warns_naming_it(old_paths):
    found = old_paths["paths"]
    assert sorted(found) == sorted(_MOVED)
    for old, new in _MOVED.items():
        name, warned = found[old]
        assert name == f"lingpipe.pipeline.{new}", old
        assert warned == [
            f"lingpipe.pipeline.{old} moved to lingpipe.pipeline.{new}; import it from there "
            "(the old path goes away in the next release)"
        ], old


def test_old_import_forms_reach_the_same_objects(old_paths):
    assert old_paths["forms"] == [True, True, True]


def test_python_m_on_the_old_schedule_path_runs_the_new_command():
    flags = ["--schedule=1f1b", "--num_stages=2", "--num_micro_batches=2"]
    new = subprocess.run(
        [sys.executable, "-m", "lingpipe.pipeline.schedules", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    old = subprocess.run(
        [sys.executable, "-m", "lingpipe.pipeline.schedule", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert new.returncode == 0 and "bubble" in new.stdout, new.stderr[-2000:]
    assert (old.returncode, old.stdout) == (0, new.stdout), old.stderr[-2000:]
    assert (
        "python -m lingpipe.pipeline.schedule moved to python -m lingpipe.pipeline.schedules "
        "(the old command goes away in the next release)"
    ) in old.stderr.splitlines()


def test_the_learning_rate_schedules_old_module_is_the_new_one_and_warns(old_paths):
    assert old_paths["shim"] == [
        True,
        [
            "lingpipe.schedules moved to lingpipe.lr_schedules; import it from there (the old "
            "path goes away in the next release)"
        ],
    ]


def test_a_params_file_naming_the_old_schedule_module_still_reads(old_paths):
    # The class is found without importing the old module.
    assert old_paths["params_file"] == [True, False]


def test_a_module_still_at_its_old_path_is_imported_as_usual(tmp_path):
    package = tmp_path / "probe_moved_pkg"
    (package / "new").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "new" / "__init__.py").write_text("")
    (package / "new" / "b.py").write_text("WHO = 'new b'\n")
    (package / "a.py").write_text("WHO = 'a at its old path'\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import probe_moved_pkg

        _moved.Install("probe_moved_pkg", {"a": "new.b", "b": "new.b"})
        _moved.Install("probe_moved_pkg", {"a": "new.b", "b": "new.b"})  # Once is enough.
        from probe_moved_pkg import a

        with pytest.warns(DeprecationWarning, match=r"^probe_moved_pkg.b moved to probe_moved_"):
            from probe_moved_pkg import b
        assert a.WHO == "a at its old path" and b.WHO == "new b"
        assert probe_moved_pkg.new.b is b
        assert sum(getattr(f, "package", None) == "probe_moved_pkg" for f in sys.meta_path) == 1
    finally:
        sys.path.remove(str(tmp_path))
        sys.meta_path[:] = [
            f for f in sys.meta_path if getattr(f, "package", None) != "probe_moved_pkg"
        ]
        for name in [m for m in sys.modules if m.startswith("probe_moved_pkg")]:
            del sys.modules[name]
