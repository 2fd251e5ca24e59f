"""Two trainer processes on loopback under MultiWorkerMirroredStrategy (TF_CONFIG).

Each worker pipelines a Regression model over 2 logical CPU devices and reads its own
shard of the data; the strategy all-reduces the gradients between them. These tests
start real processes, so they are marked slow (CI runs them); every process is
killed when a test ends, however it ends.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf
from trainer_runs import TRAINER_PARAMS, Command, Env, FreePorts, LastTrainerLine, Weights

from lingpipe import model_registry

pytestmark = pytest.mark.slow

MODEL = "--model=regression.Regression"
DEADLINE_S = 240


@contextlib.contextmanager
def Workers(logdir, *flags, num_workers=2, tag="run", model=MODEL):
    """Starts the workers; yields their Popen objects; kills whatever still runs at the end."""
    ports = FreePorts(num_workers)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    try:
        for i in range(num_workers):
            env = dict(
                Env(),
                TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}),
            )
            log = open(os.path.join(logdir, f"{tag}_worker{i}.log"), "w")
            procs.append(
                subprocess.Popen(
                    Command(
                        model,
                        f"--logdir={logdir}",
                        "--strategy=multi_worker",
                        "--logical_devices=2",
                        "--mode=train",
                        "--log_interval_steps=1",
                        *flags,
                    ),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)


def _Wait(procs, deadline_s=DEADLINE_S):
    end = time.monotonic() + deadline_s
    for p in procs:
        p.wait(timeout=max(1.0, end - time.monotonic()))
    return [p.returncode for p in procs]


def _Log(logdir, i, tag="run"):
    return open(os.path.join(logdir, f"{tag}_worker{i}.log")).read()


def _ReferenceWeights(steps):
    """One process, one replica pipelining the global batch: both workers' shards joined."""
    from lingpipe import params

    if TRAINER_PARAMS not in params.__path__:
        params.__path__.append(TRAINER_PARAMS)
    p = model_registry.GetParams("regression.Regression", "Train")
    task = p.Instantiate()
    task.CreateOptimizer()
    inp = task.CreateInputGenerator()
    shards = [iter(inp.GetDataset(tf.distribute.InputContext(2, w, 2))) for w in range(2)]
    step_fn = tf.function(task.TrainStep, autograph=False)
    for step in range(steps):
        parts = [next(s) for s in shards]
        batch = tf.nest.map_structure(lambda a, b: tf.concat([a, b], 0), *parts)
        step_fn(batch, tf.constant(step, tf.int64))
    return {
        "task/" + v.name[len("regression/") : -2] + "/.ATTRIBUTES/VARIABLE_VALUE": v.numpy()
        for v in task.trainable_variables
    }


def test_two_workers_train_as_one_process_with_the_global_batch(tmp_path):
    logdir = str(tmp_path)
    flags = ["--max_steps=6", "--checkpoint_interval_steps=3", "--mode=train_and_eval"]
    with Workers(logdir, *flags) as procs:
        codes = _Wait(procs)
    logs = [_Log(logdir, i) for i in range(2)]
    assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    assert "over 2 workers; this is worker 1" in logs[1]
    assert "global batch 8 = 2 replica(s) x 4" in logs[0]
    prints = [re.search(r"weights fingerprint (\w+)", log).group(1) for log in logs]
    assert prints[0] == prints[1]  # Bitwise the same weights on both workers.
    ckpt_dir = os.path.join(logdir, "checkpoints")
    assert sorted(f for f in os.listdir(ckpt_dir) if f.endswith(".index")) == [
        "ckpt-3.index",
        "ckpt-6.index",
    ]  # Written once, by the chief.
    # Evaluated by both over their shards (a collective), reported by the chief alone.
    result = json.load(open(os.path.join(logdir, "eval_dev.json")))
    assert result["step"] == 6 and result["examples"] == 512
    assert "Eval Dev at step 6" in logs[0] and "Eval Dev" not in logs[1]
    got = Weights(os.path.join(ckpt_dir, "ckpt-6"))
    want = _ReferenceWeights(6)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.extended  # test_hosts' killed worker stays in the default run
def test_a_killed_worker_fails_the_run_clearly_and_a_restart_resumes(tmp_path):
    logdir = str(tmp_path)
    ckpt_dir = os.path.join(logdir, "checkpoints")
    flags = ["--max_steps=100000", "--checkpoint_interval_steps=5", "--collective_timeout_s=20"]
    with Workers(logdir, *flags) as procs:
        end = time.monotonic() + DEADLINE_S
        while not os.path.exists(os.path.join(ckpt_dir, "ckpt-10.index")):
            assert all(p.poll() is None for p in procs), _Log(logdir, 0)[-3000:]
            assert time.monotonic() < end, "no checkpoint appeared in time"
            time.sleep(0.05)
        procs[1].send_signal(signal.SIGKILL)
        code = _Wait(procs[:1], deadline_s=120)[0]
    log = _Log(logdir, 0)
    assert code == 1, log[-3000:]
    last = LastTrainerLine(log)
    assert re.match(r"lingpipe.trainer: error: Step \d+ failed: \w+", last), last
    assert "restart every worker with the same command" in last
    latest = tf.train.latest_checkpoint(ckpt_dir)
    assert Weights(latest)  # Still readable.
    resumed_at = int(latest.rsplit("-", 1)[1])

    restart = [f"--max_steps={resumed_at + 3}", "--checkpoint_interval_steps=5"]
    with Workers(logdir, *restart, tag="restart") as procs:
        codes = _Wait(procs)
    logs = [_Log(logdir, i, "restart") for i in range(2)]
    assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    for log in logs:
        assert f"Resumed from {latest} at step {resumed_at}" in log
    assert tf.train.latest_checkpoint(ckpt_dir).endswith(f"ckpt-{resumed_at + 3}")


@pytest.mark.extended  # test_two_workers_train_as_one_process stays
def test_readme_transformer_lm_tiny_trains_on_two_workers(tmp_path):
    """README's multi_worker command: each replica's batch is unknown when the step is
    traced (tf.distribute), so the pipeline splits it into micro-batches at run time."""
    logdir = str(tmp_path)
    flags = ["--max_steps=3", "--num_stages=2", "--collective_timeout_s=120"]
    with Workers(logdir, *flags, model="--model=lm.TransformerLmTiny") as procs:
        codes = _Wait(procs)
    logs = [_Log(logdir, i) for i in range(2)]
    assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    assert "Traceback" not in logs[0] + logs[1]
    prints = [re.search(r"weights fingerprint (\w+)", log).group(1) for log in logs]
    assert prints[0] == prints[1]
    assert tf.train.latest_checkpoint(os.path.join(logdir, "checkpoints")).endswith("ckpt-3")
