"""--profile_steps end to end: one trainer run (a subprocess, shared by the tests here)
writes TensorFlow's profile, timeline.json (a Chrome trace with a span per action)
and timeline.png; and the params text summary is in train/."""

import glob
import json
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf

from lingpipe.pipeline.schedules import generators

pytestmark = pytest.mark.slow

K, M, FIRST, LAST = 2, 4, 5, 6


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(logdir, CompletedProcess) of a short profiled training run."""
    logdir = str(tmp_path_factory.mktemp("profile") / "run")
    command = [
        sys.executable, "-m", "lingpipe.trainer", "--model=lm.TransformerLmTiny",
        f"--logdir={logdir}", "--mode=train", f"--num_stages={K}",
        f"--num_micro_batches={M}", f"--profile_steps={FIRST},{LAST}", "--max_steps=7",
        "--logical_devices=2", "--intra_op_threads=1", "--inter_op_threads=2",
    ]  # fmt: skip
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return logdir, done


def test_timeline_json_has_every_action_of_each_step_in_schedule_order(run):
    logdir, _ = run
    with open(os.path.join(logdir, "timeline.json")) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    for e in events:
        assert {"name", "ph", "ts", "dur", "pid", "tid"} <= set(e), e
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["args"]["step"] for e in spans} == {0, 1}  # steps 5 and 6
    sched = generators.Make("gpipe", K, M)
    for step in (0, 1):
        for d in range(K):
            mine = sorted(
                (e for e in spans if e["args"]["step"] == step and e["tid"] == d),
                key=lambda e: e["ts"],
            )
            # a forward and a backward of every micro-batch of the device's stage, in the
            # schedule's order (forwards 0..M-1, then the backwards)
            assert [e["name"] for e in mine] == [str(a) for a in sched.device_actions[d]]


def test_png_profile_and_printed_idle_shares(run):
    logdir, done = run
    with open(os.path.join(logdir, "timeline.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))
    for d in range(K):
        assert f"device {d}: busy" in done.stdout and "simulated idle  20.0%" in done.stdout


def test_params_text_summary_reads_back(run):
    logdir, _ = run
    texts = []
    for path in glob.glob(os.path.join(logdir, "train", "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == "params":
                    texts.append(tf.make_ndarray(value.tensor).item().decode())
    assert len(texts) == 1
    with open(os.path.join(logdir, "params.txt")) as f:
        params = [line for line in f.read().splitlines() if not line.startswith("#")]
    assert [line.strip() for line in texts[0].splitlines()] == [p.strip() for p in params]
    assert f"num_micro_batches : {M}" in texts[0]


def test_memory_per_stage_is_printed_beside_the_measured_peak(run):
    _, done = run
    out = done.stdout
    assert "memory per stage in a training step, MiB" in out
    # On CPU one allocator serves every logical device: the sum is compared.
    match = re.search(r"estimated total ([\d.]+) MiB; measured peak ([\d.]+) MiB", out)
    assert match, out[-2000:]
    estimate, measured = (float(g) for g in match.groups())
    assert estimate > 0 and measured > 0
