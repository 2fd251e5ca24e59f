"""The memory estimate against numbers computed by hand for a small MLP.

Four cells x -> relu(x W + b), W [8, 8], b [8], float32, cut into K=2 stages of two
cells; batch 16, M=4 micro-batches of 4 rows. By hand, in bytes:

- a cell's weights: (8*8 + 8) * 4 = 288; a stage's: 576 (gradients the same).
- one micro-batch's activation [4, 8]: 128. A cell's backward reads its input
  (for dW) and its ReLU output (for the ReLU's gradient): a stage of two cells
  keeps its input (the boundary, 128) and two ReLU outputs (internal, 256; the
  first one's output is the second one's input, counted once).
- stage 0's micro-batches are slices of the batch [16, 8], 512, alive all step.
- a backward's workspace, beside the activations: a cell's backward receives its
  output's gradient (128), writes the ReLU's gradient into it (in place), frees the
  ReLU's output (128) that only it reads, then makes its input's gradient (128): one
  activation's worth at most, as the next cell's does after it; and one cell's weight
  gradient (288) before it joins the sum: 416.
"""

import dataclasses

import pytest
import tensorflow as tf

from lingpipe import optimizers
from lingpipe.layers import feedforward, gpipe, linear
from lingpipe.pipeline.observe import memory, op_walk
from lingpipe.pipeline.schedules import generators, simulate
from lingpipe.pipeline.step import micro_batch, remat

CELL_W, STAGE_W, ACT, BATCH = 288, 576, 128, 512


def Pipe(schedule="gpipe", remat="always", input_shapes=([16, 8],), fprop_dtype=None):
    cell = linear.ProjectionLayer.Params().Set(
        input_dims=8, output_dims=8, activation="RELU", fprop_dtype=fprop_dtype
    )
    p = gpipe.PipeliningLayer.Params().Set(
        name="pipe", cell_tpl=[cell.Copy() for _ in range(4)], num_stages=2, num_micro_batches=4,
        remat=remat, schedule=schedule, input_shapes=input_shapes,
    )  # fmt: skip
    return p.Instantiate()


# (schedule, remat) -> activation bytes of (stage 0, stage 1), by hand:
# 'always' keeps the boundary of each alive micro-batch and replays one; 'never'
# keeps everything of each alive one. GPipe: 4 alive on both stages; 1F1B: 2 on
# stage 0, 1 on stage 1. 'except_last' under GPipe keeps micro-batch 3, which is
# differentiated first: 3 boundaries + one kept micro-batch, as 'always' costs.
EXPECTED = {
    ("gpipe", "always"): (BATCH + 2 * ACT, 4 * ACT + 2 * ACT),
    ("gpipe", "except_last"): (BATCH + 2 * ACT, 3 * ACT + 3 * ACT),
    ("gpipe", "never"): (BATCH + 4 * 2 * ACT, 4 * 3 * ACT),
    ("1f1b", "always"): (BATCH + 2 * ACT, 1 * ACT + 2 * ACT),
    # 1F1B keeps stage 0's micro-batch 0 (only forwards before its backward) and stage
    # 1's micro-batch 3 (F3 B3 adjacent): never two micro-batches' activations at once.
    ("1f1b", "except_last"): (BATCH + 2 * ACT, 1 * ACT + 2 * ACT),
    ("1f1b", "never"): (BATCH + 2 * 2 * ACT, 1 * 3 * ACT),
}


@pytest.mark.parametrize("schedule,remat", sorted(EXPECTED))
def test_estimate_matches_hand_computed_mlp(schedule, remat):
    report = Pipe(schedule, remat).PartitionReport(optimizer=optimizers.Adam.Params())
    got = [s.memory for s in report.stages]
    assert [m.activations for m in got] == list(EXPECTED[(schedule, remat)])
    for m in got:
        assert (m.weights, m.gradients, m.optimizer_slots) == (STAGE_W, STAGE_W, 2 * STAGE_W)
        assert m.workspace == ACT + CELL_W
        assert m.total == 4 * STAGE_W + m.activations + m.workspace
    alive = {"gpipe": [4, 4], "1f1b": [2, 1]}[schedule]
    assert [m.peak_alive for m in got] == alive
    assert report.memory_total == sum(m.total for m in got)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("remat", [["always", "never"], ("never", "except_last")])
def test_one_policy_per_stage_is_estimated_stage_by_stage(schedule, remat):
    report = Pipe(schedule, remat).PartitionReport(optimizer=optimizers.Adam.Params())
    got = [s.memory.activations for s in report.stages]
    # Each stage costs what its own policy costs on every stage.
    assert got == [EXPECTED[(schedule, r)][s] for s, r in enumerate(remat)]
    # Between recomputing everywhere and nowhere; strictly under GPipe (under 1F1B the
    # last stage holds one micro-batch at a time, so 'always' there costs what 'never' does).
    always, never = (
        Pipe(schedule, r).PartitionReport(optimizer=optimizers.Adam.Params()).memory_total
        for r in ("always", "never")
    )
    assert always <= report.memory_total <= never
    if schedule == "gpipe":
        assert always < report.memory_total < never
    assert f"remat=[{', '.join(remat)}], optimizer Adam" in str(report)


def test_bfloat16_cells_are_estimated_in_bfloat16():
    import tensorflow as tf

    def Activations(dtype):
        report = Pipe(fprop_dtype=dtype).PartitionReport()
        assert report.memory_total is not None, report.memory_note
        return [s.memory.activations for s in report.stages]

    # Half the bytes per activation, plus the bfloat16 copies of the weights that the
    # backward reads (each cell casts its float32 weights where it uses them).
    bf16, f32 = Activations(tf.bfloat16), Activations(None)
    assert all(f / 2 < b < f for b, f in zip(bf16, f32)), (bf16, f32)


def test_slot_bytes_per_optimizer():
    shapes = [[3, 5], [5]]  # 20 weights
    assert memory.SlotBytes(None, shapes) == 0
    assert memory.SlotBytes(optimizers.SGD.Params(), shapes) == 0
    assert memory.SlotBytes(optimizers.Momentum.Params(), shapes) == 20 * 4
    assert memory.SlotBytes(optimizers.Adam.Params(), shapes) == 2 * 20 * 4
    assert memory.SlotBytes(1.5, shapes) == 30 * 4
    # Adafactor: a weight-sized slot, plus row (3) and column (5) means of the matrix.
    assert memory.SlotBytes(optimizers.Adafactor.Params(), shapes) == (20 + 3 + 5) * 4
    with pytest.raises(ValueError, match=r"expected optimizer to be None, .* received 'adam'"):
        memory.SlotBytes("adam", shapes)

    # A subclass counts as its base; one of BaseOptimizer that does not say is refused.
    class Lamb(optimizers.Adam):
        pass

    class Unsaid(optimizers.BaseOptimizer):
        pass

    assert memory.SlotBytes(Lamb.Params(), shapes) == 2 * 20 * 4
    with pytest.raises(ValueError, match=r"counts its slots \(SlotElements\); received"):
        memory.SlotBytes(Unsaid.Params(), shapes)


def test_report_prints_the_memory_table_and_the_measured_peak():
    report = Pipe("1f1b", "always").PartitionReport(optimizer=1)
    report.measured = {"all CPU devices (one allocator)": report.memory_total * 2}
    lines = str(report).splitlines()
    at = lines.index(
        "memory per stage in a training step, MiB (schedule=1f1b K=2 M=4 remat=always, "
        "1 optimizer slots per weight):"
    )
    assert lines[at + 1].split() == [
        "stage", "weights", "grads", "slots", "activations", "workspace", "update", "total",
        "alive",
    ]  # fmt: skip
    assert lines[at + 2].split()[0] == "0" and lines[at + 2].split()[-1] == "2"
    total = report.memory_total / 2**20
    assert lines[-1] == (
        f"estimated total {total:.1f} MiB; measured peak {2 * total:.1f} MiB "
        "(all CPU devices (one allocator)), estimate / measured 0.50"
    )
    # Without input shapes there is nothing to estimate and nothing is printed.
    assert "memory" not in str(Pipe(input_shapes=None).PartitionReport())


def _Estimate(name, k, m, v=1, remat_kept=()):
    """memory.Estimate of one hand-checked cell per stage under schedule `name`."""
    sched = generators.Make(name, k, m, v)
    pipe = Pipe()
    cell = pipe.params.cell_tpl[0]
    return sched, memory.Estimate(
        pipe.params, [cell] * sched.num_stages, [[s] for s in range(sched.num_stages)],
        ([16, 8],), sched, set(remat_kept),
    )  # fmt: skip


def test_a_device_of_the_v_placement_holds_both_its_stages():
    sched, stages = _Estimate("zbv", 2, 4)
    # One cell per stage, remat 'always': a micro-batch keeps its boundary (128) while
    # alive, and a backward replays one cell's ReLU output (128).
    sim = simulate.Simulate(sched)
    assert [s.peak_alive for s in stages] == sim.peak_alive
    device_0 = memory.DeviceMemory([stages[s] for s in sched.StagesOf(0)])
    assert device_0.weights == 2 * CELL_W and device_0.workspace == stages[0].workspace
    # Stage 0's boundary is the batch itself (512, alive all step); stage 3's micro-batches
    # hold 128 each: device 0's activations peak when stage 3 holds its most at once.
    assert device_0.peak_alive == sim.device_peak_alive[0]
    assert BATCH + ACT <= device_0.activations <= stages[0].activations + stages[3].activations
    assert device_0.total <= stages[0].total + stages[3].total


def test_forward_only_holds_one_micro_batch_per_stage_and_no_backward():
    _, stages = _Estimate("forward_only", 2, 4)
    assert [s.peak_alive for s in stages] == [1, 1]
    assert [s.workspace for s in stages] == [0, 0]
    assert stages[1].activations == ACT  # its input while its forward runs


def test_report_adds_each_device_when_it_runs_several_stages():
    from lingpipe.pipeline.planning import report as report_lib

    sched, mems = _Estimate("zbv", 2, 4)
    stages = [
        report_lib.StageReport(
            s, f"/device:CPU:{sched.DeviceOf(s)}", [f"cell_{s}"], 72, None, None, 1.0
        )
        for s in range(4)
    ]
    report = report_lib.PartitionReport("uniform", 4, stages)
    report.AddMemory(lambda: mems, memory.Note(sched, "always", None))
    device_0 = memory.DeviceMemory([mems[0], mems[3]])
    text = str(report)
    assert "per device (all its stages; activations at their joint peak):" in text
    assert f"  /device:CPU:0 (stages 0, 3): {device_0.total / 2**20:.1f} MiB, alive " in text
    assert report.DeviceMemory()["/device:CPU:1"] == memory.DeviceMemory([mems[1], mems[2]])


@pytest.mark.parametrize("batch_dim", [0, 1])
def test_the_estimate_cuts_the_inputs_as_the_pipeline_splits_them(batch_dim):
    # A per-model table comes first; the batch (16, or 15: uneven) is what most leaves share.
    for batch in (16, 15):
        shapes = [[5, 8], [batch, 8], [batch]] if batch_dim == 0 else [[2, 5], [8, batch, 3]]
        if batch_dim == 1:
            shapes.append([1, batch])
        tensors = tuple(tf.zeros(s) for s in shapes)
        sizes = micro_batch.Sizes(micro_batch.BatchSize(tensors, batch_dim), 4)
        want = [t.shape.as_list() for t in micro_batch.Split(tensors, sizes, batch_dim)[0]]
        specs = tuple(tf.TensorSpec(s) for s in shapes)
        got = memory.MicroBatchSpecs(specs, 4, batch_dim)
        assert [s.shape.as_list() for s in got] == want


def test_an_unknown_batch_is_refused_by_name():
    for specs in [(tf.TensorSpec([None, 8]),), (tf.TensorSpec([None, 8]), tf.TensorSpec([None]))]:
        with pytest.raises(ValueError, match=r"^memory estimate: expected a static batch size, "):
            memory.MicroBatchSpecs(specs, 4, 0)
    with pytest.raises(ValueError, match=r"memory estimate: no input tensor has a dimension "):
        memory.MicroBatchSpecs((tf.TensorSpec([]),), 4, 0)


def test_a_cell_counts_the_gradients_its_weight_ops_wait_for():
    # x -> relu(x W + b): the input's gradient needs dz = ReluGrad(dy, relu_out) [4, 8];
    # the weights' (x^T dz and the bias's sum of dz) read dz, held from I to W: 128.
    cell = Pipe().params.cell_tpl[0]
    (traced,) = memory.TracedFor(Pipe().params, [cell], ([16, 8],), 4)
    assert traced.deferred_bytes == ACT
    # Of what its backward reads, W reads x (the input, for x^T dz); ReluGrad, an op of
    # I, reads the ReLU's output, freed when I ends.
    assert (traced.weight_input_saved_bytes, traced.weight_saved_bytes) == (ACT, 0)
    assert (traced.input_saved_bytes, traced.saved_bytes) == (ACT, ACT)


def test_the_workspace_holds_the_widest_gradient_a_cell_s_backward_passes_on():
    # A feed-forward cell 8 -> 64 (ReLU) -> 8 on 16 rows receives and sends gradients of
    # [16, 8] (512 bytes) but passes [16, 64] (4096) between its two layers: its
    # backward holds that and one [16, 8] gradient at once; ReluGrad writes into the
    # gradient it reads last (in place, nothing added). Then its weights' gradient.
    cell = feedforward.FeedForwardNet.Params().Set(
        name="ffn", input_dims=8, hidden_layer_dims=[64, 8], activation=["RELU", "NONE"]
    )
    p = gpipe.PipeliningLayer.Params().Set(name="pipe", cell_tpl=[cell], input_shapes=[[16, 8]])
    (traced,) = memory.TracedFor(p, [cell], ([16, 8],), 1)
    assert traced.backward_transient_bytes == 4096 + 512
    weights = (8 * 64 + 64 + 64 * 8 + 8) * 4
    # Split, I holds what W will read from when it makes it: the gradient received (for
    # the second kernel's) and the wide one (for the first's), with the inputs' gradient
    # it sends at the end; W holds the weights' gradients.
    assert (traced.input_transient_bytes, traced.input_end_bytes) == (512 + 4096 + 512,) * 2
    spaces = memory.StageWorkspaces(memory.Units([traced]), 512, 512)
    assert (spaces.input, spaces.weight) == (512 + 4096 + 512, weights)
    # A B whose runtime runs the weights' gradient ops last holds what I holds: the
    # workspace takes the larger walk.
    assert spaces.backward == 512 + 4096 + 512 + weights


def test_transients_pass_a_buffer_to_an_element_wise_op_that_reads_it_last():
    graph = tf.Graph()
    with graph.as_default():
        dy = tf.compat.v1.placeholder(tf.float32, [256])  # received: 1 KiB
        a = tf.tile(dy, [4])  # 4 KiB; dy freed after
        b = tf.nn.relu(a)  # reads a last: in place
        c = tf.concat([b, b], 0)  # 8 KiB, with b alive
        d = tf.reduce_sum(c)
        ops = [op for op in graph.get_operations() if op is not dy.op]
        assert op_walk.Transients(ops, {d.ref()}, received=[dy])[0] == 4096 + 8192
        # With `a` read again after the concat, b needs a buffer of its own.
        e = a + 1.0
        ops = [op for op in graph.get_operations() if op is not dy.op]
        assert op_walk.Transients(ops, {d.ref(), e.ref()}, received=[dy])[0] == 2 * 4096 + 8192


def test_an_einsum_holds_copies_of_its_operands_while_it_runs():
    graph = tf.Graph()
    with graph.as_default():
        dy = tf.compat.v1.placeholder(tf.float32, [8, 16, 32])  # received: 16 KiB
        q = tf.compat.v1.placeholder(tf.float32, [8, 16, 32])  # held: 16 KiB
        scores = tf.einsum("bqd,bkd->bqk", dy, q)  # 8 KiB
        out = tf.reduce_sum(scores)
        ops = [op for op in graph.get_operations() if op.type != "Placeholder"]
        # At the Einsum: dy, q, its output and a copy of each operand (the kernel
        # transposes them into a buffer of its own), on top of the held q.
        peak, end = op_walk.Transients(ops, {out.ref()}, held=[q], received=[dy])
        assert peak == 16384 + 8192 + 2 * 16384
        # q and dy read last by the Einsum, the copies gone with it: the sum is left.
        assert end == 4 - 16384


# Split backward (zero bubble, K=2, M=4; one unit per F, I, W):
#   dev 0: F0 F1 .  I0 W0 F2 I1 W1 F3 I2 W2 I3 W3
#   dev 1: .  F0 I0 F1 I1 W0 F2 I2 W1 F3 I3 W2 W3
# Remat 'never': a micro-batch holds boundary + internal (stage 0: 256, the batch is
# counted once; stage 1: 128 + 256) from F to I's end; from I's end to W's end, what W
# reads (each cell's input x: stage 0: 128, the first cell's x being the batch; stage
# 1: 256) and the two cells' dz (2 * 128) that I made for W. Stage 1 at t=5..6 holds
# micro-batches 0 and 1, both between I and W: 2 * (256 + 256). Stage 0 at t=4..5:
# micro-batch 0 between I and W (128 + 256) and 1 (256).
def test_deferred_weight_gradients_are_counted_for_split_backward_schedules():
    report = Pipe("zero_bubble", "never").PartitionReport()
    got = [s.memory.activations for s in report.stages]
    assert got == [BATCH + (1 + 2) * ACT + 2 * ACT, 2 * (2 + 2) * ACT]
    # 1F1B runs I and W together: nothing waits, its figures stay as they were.
    ones = Pipe("1f1b", "never").PartitionReport()
    assert [s.memory.activations for s in ones.stages] == list(EXPECTED[("1f1b", "never")])


def test_a_v_shaped_split_schedule_holds_the_deferred_gradients_of_both_its_stages():
    import dataclasses

    sched, pipe = generators.Make("zbv", 2, 4), Pipe()
    (cell,) = memory.TracedFor(pipe.params, [pipe.params.cell_tpl[0]], ([16, 8],), 4)

    def Estimate(traced):
        return memory.Estimate(
            pipe.params, [pipe.params.cell_tpl[0]] * 4, [[s] for s in range(4)],
            ([16, 8],), sched, kept, traced=[traced] * 4,
        )  # fmt: skip

    kept = {(s, m) for s in range(4) for m in range(4)}  # remat 'never'

    # Held gradients three times the cell's dz (128), so that they outweigh what I frees.
    held = 3 * ACT
    with_w = Estimate(dataclasses.replace(cell, deferred_bytes=held))
    without = Estimate(dataclasses.replace(cell, deferred_bytes=0))
    sim = simulate.Simulate(sched)
    for s in range(4):
        events = list(without[s].events)
        for m in range(4):  # each micro-batch's gradients, held from its I's end to its W's
            events.append((sim.end[simulate.Action("I", s, m)], held))
            events.append((sim.end[simulate.Action("W", s, m)], -held))
        assert with_w[s].activations == simulate.PeakOf(events) + (BATCH if s == 0 else 0)
        assert with_w[s].activations > without[s].activations
    # A device adds both its stages' (0 and 3 on device 0) at their joint peak.
    device_0 = memory.DeviceMemory([with_w[0], with_w[3]])
    assert device_0.activations > memory.DeviceMemory([without[0], without[3]]).activations


def test_one_allocator_s_peak_is_the_stages_joint_peak_not_their_peaks_added():
    # GPipe, K=2, M=1 under unit costs: F0 [0, 1], F1 [1, 2], B1 [2, 4], B0 [4, 6]. Each
    # stage: 2 bytes of weights, 4 of slots, 5 of activations (F to B), 4 of gradients
    # and a backward that holds 3 of workspace beside them; its first B (its only one
    # here) makes the gradients as it runs and holds at most 6 (Workspaces.first).
    sched = generators.Make("gpipe", 2, 1)
    sim = simulate.Simulate(sched)
    spaces = memory.Workspaces(backward=3, first=6, input=3, weight=3)
    stages = []
    for k in range(2):
        events = memory.ActivationEvents(sim, 1, k, {(0, 0), (1, 0)}, 0, 5)
        stages.append(
            memory.StageMemory(
                weights=2,
                gradients=4,
                optimizer_slots=4,
                activations=5,
                workspace=3,
                peak_alive=1,
                events=tuple(events),
                step_events=tuple(memory.StepEvents(sim, k, 4, spaces)),
            )
        )
    # The gradients are whole from the end of the first B: 4 from 4 on for stage 1.
    assert sorted(stages[1].step_events) == [(2.0, 6), (4.0, -6), (4.0, 4)]
    # A device with its own allocator: 6 of weights and slots; in [2, 4) (B1), 5 of
    # activations and 6 of the first B: 17; the parts added (workspace and gradients at
    # once) are 18.
    per_device = [[stages[0]], [stages[1]]]
    assert [memory.DeviceMemory(ms).total for ms in per_device] == [17, 17]
    assert [sum(dataclasses.astuple(s)[:5]) for s in stages] == [18, 18]
    # One allocator for both: in [2, 4), both stages' activations and B1's 6: 16; in
    # [4, 6), stage 0's activations, stage 1's gradients and B0's 6: 15. Plus 12.
    assert memory.HostMemory(per_device) == 12 + 16
    # Without step events (an estimate made before them): the parts of each, added.
    bare = [[dataclasses.replace(s, step_events=()) for s in ms] for ms in per_device]
    assert memory.HostMemory(bare) == 36


def test_replica_0_s_devices_also_hold_the_other_replicas_gradients_to_average_them():
    # The hand MLP under 1F1B with recompute and SGD. Replica 0 of R averages each
    # gradient where its copy lives (train_loop.ReduceOnGradientDevices); the replicas
    # run in lockstep, so the other R - 1 replicas' copies (576 a stage each) arrive as
    # the stage's last B completes its own, and one mean (of W: 256) is made beside them.
    p = Pipe("1f1b").params
    sched = generators.Make("1f1b", 2, 4)

    def Stages(replicas):
        return memory.Estimate(
            p, p.cell_tpl, [[0, 1], [2, 3]], tuple(p.input_shapes), sched,
            remat.Kept(sched, "always"), optimizers.SGD.Params(), replicas=replicas,
        )  # fmt: skip

    alone = Stages(1)
    assert [s.received for s in alone] == [0, 0]
    sim = simulate.Simulate(sched)
    last_b = sim.start[simulate.Action("B", 0, 3)]
    for replicas, received in [(2, STAGE_W + 256), (3, 2 * STAGE_W + 256)]:
        stages = Stages(replicas)
        assert [s.received for s in stages] == [received, received]
        # Held from the start of stage 0's last B to the step's end...
        assert (last_b, received) in stages[0].step_events
        assert (sim.makespan, -received) in stages[0].step_events
        # ... on top of that B's peak, which is the device's peak alone.
        assert memory.DeviceMemory([stages[0]]).total == (
            memory.DeviceMemory([alone[0]]).total + received
        )


def test_a_split_backward_s_gradients_are_whole_from_its_first_w():
    # Zero bubble, K=2, M=1 under unit costs: I1 [2, 3], W1 [3, 4], I0 [3, 4], W0 [4, 5].
    sched = generators.Make("zero_bubble", 2, 1)
    sim = simulate.Simulate(sched)
    spaces = memory.Workspaces(backward=30, first=60, input=7, weight=3)
    got = sorted(memory.StepEvents(sim, 1, 4, spaces))
    # I holds its 7; the gradients are whole from W's start (an I makes none). The first
    # W's weight gradients are the running sum (nothing joins them): no workspace of 3.
    assert got == [(2.0, 7), (3.0, -7), (3.0, 4)]
    # At M=2 the second W makes gradients beside the sum before they join it: its 3.
    sim = simulate.Simulate(generators.Make("zero_bubble", 2, 2))
    w1 = simulate.Action("W", 1, 1)
    got = memory.StepEvents(sim, 1, 4, spaces)
    assert (sim.start[w1], 3) in got and (sim.end[w1], -3) in got
    assert sum(b for _, b in got if b == 3) == 3
    # A forward-only schedule has no backward: nothing.
    forward_only = simulate.Simulate(generators.Make("forward_only", 2, 1))
    assert memory.StepEvents(forward_only, 1, 4, spaces) == []


def test_a_b_that_runs_alone_holds_its_graph_order_walk_one_beside_another_device_more():
    # Two units whose B walks in graph order hold 2 and whose I walks (the
    # weight-gradient ops as late as W) hold 4; gradients of 8 each.
    units = [memory.Unit(3, 0, 3, 0, 8)] + [memory.Unit(2, -10, 4, -10, 8)] * 2
    spaces = memory.StageWorkspaces(units, received=2, sent=3)
    assert (spaces.backward, spaces.first) == (4 + 8, 4 + 8)
    assert (spaces.backward_alone, spaces.first_alone) == (3 + 8, 2 + 8)  # at least 3
    devices = [0, 1]

    def Held(name: str, m: int, stage: int, stage_devices=devices) -> list:
        sim = simulate.Simulate(generators.Make(name, 2, m))
        events = memory.StepEvents(sim, stage, 4, spaces, 0, stage_devices)
        return [b for _, b in sorted(e for e in events if e[1] > 4)]

    # GPipe at M=1 runs one action at a time: each B alone.
    assert Held("gpipe", 1, 0) == [10] and Held("gpipe", 1, 1) == [10]
    # 1F1B at M=4 runs stage 0's Bs beside stage 1's actions, but its last.
    assert Held("1f1b", 4, 0) == [12, 12, 12, 11]
    # Without the devices, every B counts as loaded.
    assert Held("gpipe", 1, 0, None) == [12]


def test_a_backward_frees_each_cell_s_activations_as_it_passes_it():
    # Three cells; the backward meets the last first. The first cell holds 20 at its
    # peak and frees nothing (its inputs are the stage's); the two after it hold 4 (2
    # in a B in graph order, 4 in an I) and free 10 of their activations each.
    # Gradients of 8 per cell.
    units = [memory.Unit(20, 0, 20, 0, 8)] + [memory.Unit(2, -10, 4, -10, 8)] * 2
    spaces = memory.StageWorkspaces(units, received=2, sent=3)
    # A B: 4 with every activation alive, then 4 - 10, then 20 - 20: 4 at most, at
    # least the larger of the gradients received and sent; plus the largest weight
    # gradient (8). (Counting every activation to the end, it was 20 + 8.)
    assert spaces.backward == 4 + 8
    # The first B keeps each cell's gradients: 4 + 8, then -2 + 12, then -4 + 28.
    assert spaces.first == 24
    # I: likewise, at least the gradients received and sent (it holds both); W, the
    # largest weight gradient.
    assert (spaces.input, spaces.weight) == (5, 8)
    assert memory.WalkPeak([(4, -10), (4, -10), (20, 0)], least=0) == 4


def test_a_replay_builds_its_activations_as_it_runs_and_w_frees_what_it_reads_as_it_runs():
    # Zero bubble, K=2, M=1 under unit costs, every stage recomputed: F0 [0, 1], F1 [1, 2],
    # I1 [2, 3], then W1 [3, 4] beside I0 [3, 4], W0 [4, 5]. Each stage: a boundary of 10
    # bytes (stage 1's), 100 of activations that a backward's replay makes, 60 of them
    # and 20 of gradients that W reads.
    sched = generators.Make("zero_bubble", 2, 1)
    sim = simulate.Simulate(sched)
    assert (sim.start[simulate.Action("I", 0, 0)], sim.start[simulate.Action("W", 1, 0)]) == (3, 3)
    both = []
    for k in range(2):
        both += memory.ActivationEvents(sim, 1, k, set(), 10 * k, 100, 20, 60)
    # I0 replays its forward in its first half (F / (F + I) of it): its 100 bytes are all
    # there at 3.5, when W1 has freed half of its 80 (a quarter at 3.25, one at 3.5).
    assert simulate.PeakOf(both) == 100 + 40
    # Without the ramp (as the micro-batches alive are counted), W1 holds its 80 to its end.
    stage_0 = memory.ActivationEvents(sim, 1, 0, set(), 0, 100, 20, 60)
    stage_1 = memory.ActivationEvents(sim, 1, 1, set(), 10, 100, 20, 60, ramp=False)
    assert simulate.PeakOf(stage_0 + stage_1) == 100 + 80
