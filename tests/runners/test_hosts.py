"""Pipeline stages on other hosts (--strategy=hosts): worker processes on loopback.

The workers are `python -m lingpipe.worker` processes on 127.0.0.1 at ports picked
free; the clients (the trainer, or hosts_pipeline_client.py) run in their own
processes, since connecting to a cluster changes TensorFlow's context for good.
Every process a test starts is killed when the test (or the module) ends, however
it ends, and every wait is bounded.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from host_workers import DEADLINE_S, CheckpointStep, Chief, Cluster, Read, Stop, TfConfig, Workers
from trainer_runs import LM, Command, Env, FreePorts, LastTrainerLine

from lingpipe import worker
from lingpipe.pipeline.planning import report
from lingpipe.runners import hosts

HERE = os.path.dirname(__file__)


@pytest.fixture(scope="module")
def three_workers(tmp_path_factory):
    """Three workers of 2 logical CPU devices each, shared by the module's tests."""
    logdir = str(tmp_path_factory.mktemp("workers"))
    spec = Cluster(3)
    with Workers(spec, logdir) as procs:
        yield spec, procs, logdir


def _Losses(log):
    return {int(s): float(v) for s, v in re.findall(r"step (\d+)/\d+ .*?\bloss=([-\d.e]+)", log)}


# ---- Fast: pure functions ----------------------------------------------------


def test_stages_fill_each_workers_devices_in_order():
    devices = {
        0: ["/job:worker/replica:0/task:0/device:CPU:0", "/w0/device:CPU:1"],
        1: ["/w1/device:GPU:0", "/w1/device:CPU:0"],
    }
    assert hosts.StageGroups(devices, 3) == [
        ["/job:worker/replica:0/task:0/device:CPU:0", "/w0/device:CPU:1", "/w1/device:GPU:0"]
    ]
    with pytest.raises(ValueError, match=r"4 stages need 4 devices, but the 2 worker\(s\) offer 3"):
        hosts.StageGroups(devices, 4)


def test_tf_config_errors_say_what_the_trainer_and_worker_expect():
    with pytest.raises(ValueError, match="TF_CONFIG, which is not set"):
        hosts.ReadCluster(None)
    with pytest.raises(ValueError, match=r"has 0 chief\(s\) and 2 worker\(s\); expected one chief"):
        hosts.ReadCluster(json.dumps({"cluster": {"worker": ["a:1", "b:2"]}}))
    spec = {"chief": ["c:1"], "worker": ["a:1"]}
    with pytest.raises(ValueError, match=r"this process is task \('worker', 0\); the trainer"):
        hosts.ReadCluster(TfConfig(spec, "worker", 0))
    assert hosts.ReadCluster(TfConfig(spec, "chief", 0)) == hosts.Cluster("c:1", ("a:1",))
    with pytest.raises(worker.WorkerError, match="the task is the chief, which is the trainer"):
        worker.ReadTask(TfConfig(spec, "chief", 0))
    with pytest.raises(worker.WorkerError, match=r"task \('worker', 3\) is not in the cluster"):
        worker.ReadTask(TfConfig(spec, "worker", 3))


def test_a_worker_s_thread_flags_reach_its_server_and_a_bad_flag_is_one_line(monkeypatch, capsys):
    import tensorflow as tf

    made = []
    monkeypatch.setattr(tf.distribute, "Server", lambda *a, **kw: made.append(kw["config"]))
    worker._StartServer({"worker": ["a:1"]}, "worker", 0, 1, 1, 2)  # noqa: SLF001
    assert (made[0].intra_op_parallelism_threads, made[0].inter_op_parallelism_threads) == (1, 2)
    with pytest.raises(SystemExit) as ended:
        worker.main(["--inter_op_threads=-1"])
    assert ended.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.endswith("--inter_op_threads: expected an integer >= 0 (0: TensorFlow's "
                         "default), received -1"), last  # fmt: skip
    with pytest.raises(SystemExit) as ended:
        worker.main(["--profiler_port=70000"])
    assert ended.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.endswith(
        "--profiler_port: expected a port in [1, 65535], or 0 for none, received 70000"
    ), last
    # A port already taken: TensorFlow's profiler would log it and serve nothing. The
    # worker says so and exits 1 before it starts its server.
    import socket

    monkeypatch.setenv("TF_CONFIG", TfConfig({"chief": ["c:1"], "worker": ["a:1"]}, "worker", 0))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert worker.main([f"--profiler_port={port}"]) == 1
    assert len(made) == 1  # no server started
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"lingpipe.worker: error: cannot serve the profiler on port {port}: ")


def test_a_worker_lost_during_a_save_is_named_not_reported_as_an_unwritable_checkpoint():
    from lingpipe.runners import checkpointer, train_loop

    class Saver:
        latest = "/run/checkpoints/ckpt-5"

        def Save(self, step):
            raise checkpointer.CheckpointError(f"cannot write checkpoint ckpt-{step}")

    (closed,) = FreePorts(1)  # nothing listens there: the worker is gone
    trainer = object.__new__(hosts.HostsTrainer)
    trainer._cluster = hosts.Cluster("127.0.0.1:1", (f"127.0.0.1:{closed}",))
    trainer._checkpointer, trainer._is_chief, trainer._saved_step = Saver(), True, 5
    trainer._signals, trainer._step_timeout_s = None, None  # set by Train and __init__
    with pytest.raises(train_loop.ClusterError, match=r"^Step 10 failed: worker 0 \(127"):
        trainer._Save(10)


def test_a_worker_lost_as_a_save_finishes_is_named_after_the_step_that_was_saved():
    # TensorFlow records the checkpoint in its state file, then waits for the cluster's
    # pending ops: a worker killed in that wait fails the save after ckpt-10 is whole.
    from lingpipe.runners import checkpointer, train_loop

    class Saver:
        latest = "/run/checkpoints/ckpt-5"

        def Save(self, step):
            self.latest = f"/run/checkpoints/ckpt-{step}"
            raise checkpointer.CheckpointError(f"cannot write checkpoint ckpt-{step}")

    (closed,) = FreePorts(1)
    trainer = object.__new__(hosts.HostsTrainer)
    trainer._cluster = hosts.Cluster("127.0.0.1:1", (f"127.0.0.1:{closed}",))
    trainer._checkpointer, trainer._is_chief, trainer._saved_step = Saver(), True, 5
    trainer._signals, trainer._step_timeout_s = None, None
    with pytest.raises(train_loop.ClusterError) as raised:
        trainer._Save(10)
    text = str(raised.value)
    assert re.match(r"^After step 10 was saved: worker 0 \(127\.0\.0\.1:\d+\) is gone", text)
    assert "latest: /run/checkpoints/ckpt-10" in text


def test_report_counts_the_bytes_that_cross_each_host_boundary_per_step():
    w = "/job:worker/replica:0/task:{}/device:CPU:{}"
    devices = [w.format(0, 0), w.format(0, 1), w.format(1, 0), w.format(1, 1)]
    stages = [report.StageReport(k, d, [f"c{k}"], 1, 0, 1024, 1.0) for k, d in enumerate(devices)]
    r = report.PartitionReport("uniform", 4, stages)
    # 4 micro-batches x 1 KiB forward, as much back; only stage 1 -> 2 crosses hosts.
    assert r.CrossHostBytes() == [0, 8192, 0, 0]
    assert "2 hosts: 8.0 KiB cross between hosts per step" in str(r)
    one_host = report.PartitionReport("uniform", 4, stages[:1])
    assert "to next host" not in str(one_host) and "hosts:" not in str(one_host)


def test_gradient_traffic_counts_each_weight_whose_replica_copy_is_on_another_host():
    w = "/job:worker/replica:0/task:{}/device:CPU:{}"
    replica_0 = [(w.format(0, 0), 400), (w.format(0, 1), 100), (w.format(1, 0), 10)]
    replica_1 = [(w.format(1, 1), 400), (w.format(2, 0), 100), (w.format(1, 1), 10)]
    # Weight 2 of both copies lives on worker 1: averaged there without crossing hosts.
    assert hosts.GradientTraffic([replica_0, replica_1]) == 2 * (400 + 100)
    assert hosts.GradientTraffic([replica_0, replica_0, replica_1]) == 2 * (400 + 100)
    assert hosts.GradientTraffic([replica_0]) == 0


# ---- Worker processes on loopback ---------------------------------------------


@pytest.mark.slow
def test_pipeline_over_workers_equals_one_host_under_gpipe_and_1f1b(three_workers, tmp_path):
    spec, _, _ = three_workers
    spec = dict(spec, chief=[f"127.0.0.1:{FreePorts(1)[0]}"])
    out = str(tmp_path / "out.json")
    client = [sys.executable, os.path.join(HERE, "hosts_pipeline_client.py"), json.dumps(spec), out]
    done = subprocess.run(client, capture_output=True, text=True, timeout=DEADLINE_S, env=Env())
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.load(open(out))
    assert sorted(results) == [
        f"{layout}/{s}" for layout in ("three_workers", "two_workers") for s in ("1f1b", "gpipe")
    ]
    for case, r in results.items():
        assert r["loss"] == pytest.approx(r["want_loss"], rel=1e-5), case
        assert r["num_grads"] == 16 and r["grad_diff"] < 1e-5, (case, r["grad_diff"])
        assert r["variables_misplaced"] == [], case
        assert r["ops_checked"]["F"] > 0 and r["ops_checked"]["B"] > 0, (case, r["ops_checked"])
        assert r["ops_misplaced"] == [], (case, r["ops_misplaced"][:5])


# Enough steps for the curves to part if anything differed (the loss falls from the
# first step); each costs the hosts runs round trips between processes.
NUM_STEPS = 20
STEPS = [f"--max_steps={NUM_STEPS}", "--log_interval_steps=1"]


@pytest.fixture(scope="module")
def one_host_losses(tmp_path_factory):
    """{step: loss} of NUM_STEPS steps of one 4-stage pipeline on this host."""
    logdir = str(tmp_path_factory.mktemp("one_host"))
    one = subprocess.run(
        Command(LM, "--num_stages=4", *STEPS, f"--logdir={logdir}", "--mode=train"),
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        env=Env(),
    )
    assert one.returncode == 0, one.stderr[-3000:]
    return _Losses(one.stderr)


def _AssertSameCurve(got, want):
    assert sorted(got) == list(range(1, NUM_STEPS + 1)) and sorted(want) == sorted(got)
    assert [got[s] for s in sorted(got)] == pytest.approx([want[s] for s in sorted(got)], abs=1e-4)


@pytest.mark.slow
@pytest.mark.extended  # the pipeline over workers and the killed worker's resume stay
def test_trainer_over_two_workers_trains_as_one_host_and_restores_into_it(
    three_workers, one_host_losses, tmp_path
):
    spec, _, _ = three_workers
    two = dict(spec, worker=spec["worker"][:2])
    hosts_dir, other_dir = str(tmp_path / "hosts"), str(tmp_path / "other")
    flags = ["--num_stages=4", *STEPS, f"--logdir={hosts_dir}"]
    code = Chief(two, *flags, logdir=str(tmp_path), tag="hosts")
    log = Read(str(tmp_path), "hosts")
    assert code == 0, log[-3000:]
    assert "strategy=hosts: 1 replica(s) of 4 stage(s) over 2 of the 2 worker(s)" in log
    assert f"stage 1 on worker 0 ({two['worker'][0]}) /device:CPU:1" in log
    assert f"stage 2 on worker 1 ({two['worker'][1]}) /device:CPU:0" in log
    assert re.search(r"2 hosts: [\d.]+ KiB cross between hosts per step", log)
    _AssertSameCurve(_Losses(log), one_host_losses)
    # The checkpoint (written by the client) restores into a one-host layout of 2 stages.
    shutil.copytree(hosts_dir, other_dir)
    evaluated = subprocess.run(
        Command(LM, "--num_stages=2", f"--logdir={other_dir}", "--mode=eval"),
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        env=Env(),
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    dev = [json.load(open(os.path.join(d, "eval_dev.json"))) for d in (hosts_dir, other_dir)]
    assert dev[1]["step"] == dev[0]["step"] == NUM_STEPS
    assert dev[1]["metrics"]["loss"] == pytest.approx(dev[0]["metrics"]["loss"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.extended  # test_trainer's mirrored replicas and the pipeline over workers stay
def test_replicas_of_pipelines_across_three_workers_train_as_one_pipeline(
    three_workers, one_host_losses, tmp_path
):
    # Six devices over three workers in groups of 3: replica 0 on worker 0 and 1,
    # replica 1 on worker 1 and 2; the global batch split in two, gradients averaged.
    spec, _, _ = three_workers
    flags = ["--num_stages=3", *STEPS, f"--logdir={tmp_path / 'run'}"]
    code = Chief(spec, *flags, logdir=str(tmp_path), tag="replicas")
    log = Read(str(tmp_path), "replicas")
    assert code == 0, log[-3000:]
    w = spec["worker"]
    assert "strategy=hosts: 2 replica(s) of 3 stage(s) over 3 of the 3 worker(s)" in log
    assert "gradients are averaged on replica 0's stage devices" in log
    assert f"replica 0: stage 2 on worker 1 ({w[1]}) /device:CPU:0" in log
    assert f"replica 1: stage 0 on worker 1 ({w[1]}) /device:CPU:1" in log
    assert f"replica 1: stage 2 on worker 2 ({w[2]}) /device:CPU:1" in log
    assert "global batch 32 = 2 replica(s) x 16" in log
    traffic = r"2 replicas: averaging their gradients .* moves [\d.]+ KiB between hosts"
    assert re.search(traffic, log)
    _AssertSameCurve(_Losses(log), one_host_losses)


def test_groups_beyond_the_clients_devices_are_named_idle_with_the_fix():
    import tensorflow as tf

    from lingpipe.runners import strategies

    w = "/job:worker/replica:0/task:{}/device:CPU:{}"
    cluster_spec = hosts.Cluster("127.0.0.1:1", ("127.0.0.1:2", "127.0.0.1:3"))
    groups = [[w.format(0, 0), w.format(0, 1)]]
    layout = strategies.HostsLayout(tf.distribute.get_strategy(), groups, cluster_spec, 1)
    text = layout.Describe()
    assert text.startswith("strategy=hosts: 1 replica(s) of 2 stage(s) over 1 of the 2 worker(s)")
    assert "1 more group(s) of 2 devices stay idle" in text
    assert "(--logical_devices=2 runs them all)" in text
    assert "replica 0: stage 1 on worker 0 (127.0.0.1:2) /device:CPU:1" in text


@pytest.mark.slow
def test_a_killed_worker_stops_the_run_naming_it_and_a_restart_resumes(tmp_path):
    logdir, ckpt_dir = str(tmp_path / "run"), str(tmp_path / "run" / "checkpoints")
    spec = Cluster(2)
    flags = ["--num_stages=4", "--checkpoint_interval_steps=5", "--log_interval_steps=0"]
    with Workers(spec, str(tmp_path)) as procs:
        chief = Chief(
            spec,
            *flags,
            "--max_steps=100000",
            "--mode=train",
            f"--logdir={logdir}",
            logdir=str(tmp_path),
            tag="chief",
            wait=False,
        )
        try:
            end = time.monotonic() + DEADLINE_S
            # ckpt-10 is saved once the state file names it (its .index comes earlier).
            while not CheckpointStep(ckpt_dir) >= 10:
                assert chief.poll() is None, Read(str(tmp_path), "chief")[-3000:]
                assert time.monotonic() < end, "no checkpoint appeared in time"
                time.sleep(0.05)
            procs[1].send_signal(signal.SIGKILL)
            code = chief.wait(timeout=120)
        finally:
            Stop([chief])
    last = LastTrainerLine(Read(str(tmp_path), "chief"))
    assert code == 1, last
    # The kill lands in a step (it is not saved) or as ckpt-10's save finishes.
    gone = re.match(
        r"lingpipe.trainer: error: (Step (\d+) failed|After step (\d+) was saved): "
        rf"worker 1 \({spec['worker'][1]}\) is gone",
        last,
    )
    assert gone, last
    latest = _LatestCheckpoint(ckpt_dir)
    resumed_at = int(latest.rsplit("-", 1)[1])
    assert resumed_at >= 10 and f"latest: {latest}" in last
    if gone.group(2):
        assert int(gone.group(2)) > resumed_at, last
    else:
        assert int(gone.group(3)) == resumed_at, last

    with Workers(spec, str(tmp_path), tag="restart"):
        code = Chief(
            spec,
            *flags,
            f"--max_steps={resumed_at + 5}",
            "--mode=train",
            f"--logdir={logdir}",
            logdir=str(tmp_path),
            tag="restart",
        )
    log = Read(str(tmp_path), "restart")
    assert code == 0, log[-3000:]
    assert f"Resumed from {latest} at step {resumed_at}" in log
    assert _LatestCheckpoint(ckpt_dir).endswith(f"ckpt-{resumed_at + 5}")


def _LatestCheckpoint(ckpt_dir):
    import tensorflow as tf

    return tf.train.latest_checkpoint(ckpt_dir)


def test_a_worker_address_with_nothing_listening_exits_2_naming_it(tmp_path):
    spec = Cluster(2)  # Nobody started: the ports are free.
    start = time.monotonic()
    code = Chief(
        spec,
        "--num_stages=2",
        "--collective_timeout_s=3",
        f"--logdir={tmp_path}/run",
        logdir=str(tmp_path),
        tag="chief",
    )
    last = Read(str(tmp_path), "chief").strip().splitlines()[-1]
    assert code == 2, last
    assert time.monotonic() - start < 60
    assert last.startswith(
        f"lingpipe.trainer: error: --strategy=hosts: worker 0 ({spec['worker'][0]}) does not "
        "answer (ConnectionRefusedError"
    ), last
    assert "after 3 s" in last and not os.path.exists(f"{tmp_path}/run")


# A chief that places 16 MiB of weights on worker 0's device and makes their product
# there again and again for as long as it traces the worker's profiler (argv[2], into
# argv[3]); it prints the worker's allocator's peaks read from that trace.
_PLACES_16_MIB = """
import json, sys, threading
import tensorflow as tf
from lingpipe.pipeline.observe import allocations, timeline
from lingpipe.runners import hosts
hosts.Connect(hosts.ReadCluster(sys.argv[1]))
with tf.device("/job:worker/replica:0/task:0/device:CPU:0"):
    w = tf.Variable(tf.ones([1024, 4096]))
trace = threading.Thread(
    target=tf.profiler.experimental.client.trace, args=(sys.argv[2], sys.argv[3], 500)
)
trace.start()
while trace.is_alive():
    with tf.device("/job:worker/replica:0/task:0/device:CPU:0"):
        float(tf.reduce_sum(tf.matmul(w, w, transpose_b=True)[:1, :1]))
trace.join()
peaks = allocations.Peaks(timeline.ReadXSpace(timeline.LatestProfile(sys.argv[3])))
print(json.dumps({k: [p.peak_bytes, p.requested_bytes] for k, p in peaks.items()}))
"""


def _Ready(log_path):
    """Waits until the worker's log says it is ready (bounded by DEADLINE_S)."""
    end = time.monotonic() + DEADLINE_S
    while "lingpipe.worker: ready" not in open(log_path).read():
        assert time.monotonic() < end, open(log_path).read()[-2000:]
        time.sleep(0.05)


def test_a_stopped_worker_says_the_most_its_devices_held_counting_what_the_chief_placed(
    tmp_path,
):
    # The trainer cannot read another process's allocator: each host says its own peak
    # (the stage's weights, activations and slots), what bench/plan_hosts.py reads; with
    # --profiler_port another process traces what it allocates.
    spec = Cluster(1)
    (port,) = FreePorts(1)
    with Workers(spec, str(tmp_path), flags=[f"--profiler_port={port}"]) as (proc,):
        _Ready(os.path.join(tmp_path, "worker0.log"))
        chief = dict(spec, chief=[f"127.0.0.1:{FreePorts(1)[0]}"])
        env = dict(Env(), TF_CONFIG=TfConfig(chief, "chief", 0))
        script = [_PLACES_16_MIB, TfConfig(chief, "chief", 0), f"grpc://127.0.0.1:{port}"]
        done = subprocess.run(
            [sys.executable, "-c", *script, str(tmp_path / "trace")],
            capture_output=True, text=True, timeout=DEADLINE_S, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    log = open(os.path.join(tmp_path, "worker0.log")).read().splitlines()
    assert f"lingpipe.worker: profiler on port {port}" in log
    found = re.fullmatch(
        r"lingpipe\.worker: stopped by SIGTERM; peak memory: CPU \(one allocator\) "
        r"[0-9.]+ MiB \(([0-9]+) bytes\)",
        log[-1],
    )
    assert found, log[-1]
    # The weights (16 MiB) and their 1024 x 1024 product (4 MiB) at once, at least.
    assert int(found.group(1)) >= 20 * 2**20, log[-1]
    # The trace saw the worker's allocator (not the chief's) hold them too: the weights,
    # placed before it, as their chunks; each product as it asked.
    ((peak, requested),) = json.loads(done.stdout.strip().splitlines()[-1]).values()
    assert 20 * 2**20 <= requested <= peak <= int(found.group(1)), done.stdout
