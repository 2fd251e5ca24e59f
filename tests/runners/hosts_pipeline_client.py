"""Client of test_hosts.py: one pipeline over the workers' devices and on this host.

    python hosts_pipeline_client.py CLUSTER_JSON OUT_JSON

Connects to the cluster as its chief (in its own process: a connection changes
TensorFlow's context for good, which the test process must not see), builds the
same 8-cell MLP pipeline of K=4 stages on the workers' devices and on 4 logical
CPU devices of this host, copies the weights across, and writes per layout and
schedule the loss, the largest gradient difference, where the variables live and
the compute ops of the traced step that are not on their stage's device.
"""

import json
import re
import sys

from lingpipe import cluster

cluster.SetLogicalCpuDevices(4)  # The one-host reference; before TensorFlow starts.

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from lingpipe.layers import gpipe, linear  # noqa: E402
from lingpipe.nested_map import NestedMap  # noqa: E402
from lingpipe.runners import hosts  # noqa: E402

DIMS = 8
ACTION = re.compile(r"(?:^|/)([FBIW])_s(\d+)_mb(\d+)/")  # the executor's scopes
W = "/job:worker/replica:0/task:{}/device:CPU:{}"
# Stage devices of each layout: two workers (2 stages each), three workers (1, 2, 1).
LAYOUTS = {
    "two_workers": [W.format(0, 0), W.format(0, 1), W.format(1, 0), W.format(1, 1)],
    "three_workers": [W.format(0, 0), W.format(1, 0), W.format(1, 1), W.format(2, 0)],
}


def Pipeline(devices, schedule):
    cell = linear.ProjectionLayer.Params().Set(input_dims=DIMS, output_dims=DIMS, activation="TANH")
    return (
        gpipe.PipeliningLayer.Params()
        .Set(
            name="pipe",
            cell_tpl=[cell] * 8,
            num_stages=4,
            num_micro_batches=4,
            schedule=schedule,
            devices=devices,
        )
        .Instantiate()
    )


def Loss(outputs, unused_loss_inputs=None):
    rows = tf.cast(tf.shape(outputs)[0], tf.float32)
    return NestedMap(loss=(tf.reduce_mean(tf.square(outputs) + outputs), rows))


def Step(pipe, x):
    """(loss, gradients in trainable_variables order, traced graph)."""

    def Run():
        r = pipe.ForwardBackward(pipe.theta, (x,), Loss)
        by_ref = {
            v.ref(): g for v, g in zip(tf.nest.flatten(pipe.theta), tf.nest.flatten(r.theta_grads))
        }
        return r.metrics.loss[0], [by_ref[v.ref()] for v in pipe.trainable_variables]

    fn = tf.function(Run, autograph=False)
    loss, grads = fn()
    return float(loss), [g.numpy() for g in grads], fn.get_concrete_function().graph


def Misplaced(graph, devices):
    """(ops of a stage's forward or backward not on its device, {kind: ops checked})."""
    bad, checked = [], {"F": 0, "B": 0}
    for op in graph.get_operations():
        m = ACTION.search(op.name)
        # A variable's handle and reads run where the variable lives (checked apart).
        if not m or op.type in ("Placeholder", "ReadVariableOp"):
            continue
        checked[m.group(1)] = checked.get(m.group(1), 0) + 1
        want = tf.DeviceSpec.from_string(devices[int(m.group(2))])
        if tf.DeviceSpec.from_string(op.device) != want:
            bad.append(f"{op.name} ({op.type}) on {op.device!r}")
    return bad, checked


def Case(devices, schedule, x):
    remote, local = Pipeline(devices, schedule), Pipeline([f"CPU:{k}" for k in range(4)], schedule)
    for v, w in zip(remote.trainable_variables, local.trainable_variables):
        w.assign(v.numpy())
    loss, grads, graph = Step(remote, x)
    want_loss, want_grads, _ = Step(local, x)
    scale = max(float(np.max(np.abs(g))) for g in want_grads)
    bad, checked = Misplaced(graph, devices)
    stage_of = {
        v.ref(): k
        for k, idx in enumerate(remote.stage_cells)
        for i in idx
        for v in getattr(remote, f"cell_{i}").variables
    }
    return {
        "loss": loss,
        "want_loss": want_loss,
        "grad_diff": max(float(np.max(np.abs(g - w))) for g, w in zip(grads, want_grads)) / scale,
        "num_grads": len(grads),
        "variables_misplaced": [
            f"{v.name} on {v.device}"
            for v in remote.trainable_variables
            if tf.DeviceSpec.from_string(v.device)
            != tf.DeviceSpec.from_string(devices[stage_of[v.ref()]])
        ],
        "ops_misplaced": bad,
        "ops_checked": checked,
    }


def main(cluster_json, out_path):
    spec = json.loads(cluster_json)
    hosts.Connect(hosts.Cluster(spec["chief"][0], tuple(spec["worker"])), timeout_s=60)
    x = tf.random.stateless_normal([16, DIMS], seed=[1, 2])
    results = {}
    for layout, devices in LAYOUTS.items():
        if int(devices[-1].split("task:")[1][0]) >= len(spec["worker"]):
            continue
        for schedule in ("gpipe", "1f1b"):
            tf.random.set_seed(3)
            results[f"{layout}/{schedule}"] = Case(devices, schedule, x)
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
