"""Worker processes on loopback for --strategy=hosts tests (test_hosts.py, the fault
sweep): `python -m lingpipe.worker` at free ports, and the trainer as their chief.

Every process started here is killed when its `with` block (or _Chief's wait) ends,
and every wait is bounded by DEADLINE_S.
"""

import contextlib
import json
import os
import re
import subprocess
import sys

from trainer_runs import LM, Command, Env, FreePorts

DEADLINE_S = 240


def Cluster(num_workers):
    """A cluster spec of a chief and `num_workers` workers at free loopback ports."""
    chief, *workers = FreePorts(num_workers + 1)
    return {"chief": [f"127.0.0.1:{chief}"], "worker": [f"127.0.0.1:{p}" for p in workers]}


def TfConfig(spec, task_type, index):
    return json.dumps({"cluster": spec, "task": {"type": task_type, "index": index}})


def _StartWorker(spec, index, logdir, tag="", flags=()):
    log = open(os.path.join(logdir, f"worker{index}{tag}.log"), "w")
    env = dict(Env(), TF_CONFIG=TfConfig(spec, "worker", index))
    return subprocess.Popen(
        [sys.executable, "-m", "lingpipe.worker", "--logical_devices=2", *flags],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )


def Stop(procs):
    """Kills whichever of `procs` still run and waits for them."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait(timeout=30)


@contextlib.contextmanager
def Workers(spec, logdir, tag="", flags=()):
    """Starts one worker per address of spec['worker'] (each with `flags` too); kills them
    all at the end."""
    procs = []
    try:
        for i in range(len(spec["worker"])):
            procs.append(_StartWorker(spec, i, logdir, tag, flags))
        yield procs
    finally:
        Stop(procs)


def Chief(spec, *flags, logdir, tag, wait=True):
    """The trainer as the chief of `spec` (a fresh chief port); its Popen, or its exit code.
    Its output goes to `logdir`/`tag`.log (Read)."""
    spec = dict(spec, chief=[f"127.0.0.1:{FreePorts(1)[0]}"])
    env = dict(Env(), TF_CONFIG=TfConfig(spec, "chief", 0))
    log = open(os.path.join(logdir, f"{tag}.log"), "w")
    proc = subprocess.Popen(
        Command(LM, "--strategy=hosts", *flags), stdout=log, stderr=subprocess.STDOUT, env=env
    )
    if not wait:
        return proc
    try:
        return proc.wait(timeout=DEADLINE_S)
    finally:
        Stop([proc])


def Read(logdir, tag):
    """What the process tagged `tag` wrote."""
    return open(os.path.join(logdir, f"{tag}.log")).read()


def CheckpointStep(ckpt_dir):
    """The step of the checkpoint the state file names; 0 before there is one."""
    try:
        text = open(os.path.join(ckpt_dir, "checkpoint")).read()
    except OSError:
        return 0
    match = re.search(r'^model_checkpoint_path: ".*ckpt-(\d+)"', text, re.M)
    return int(match.group(1)) if match else 0
