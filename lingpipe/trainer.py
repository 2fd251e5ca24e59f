"""The lingpipe trainer: train, evaluate or inspect a registered model.

    python -m lingpipe.trainer --model=lm.TransformerLmTiny --logdir=/tmp/lp
    python -m lingpipe.trainer --model=lm.TransformerLmTiny --logdir=/tmp/lp --mode=eval
    python -m lingpipe.trainer --model=lm.TransformerLmTiny --mode=inspect_model \\
        --num_stages=4 --params_override="num_micro_batches : 8"
    python -m lingpipe.trainer --model=lm.TransformerLmTiny --logdir=/tmp/lp \\
        --plan=auto --memory_per_device=64MiB    # or --plan=FILE from python -m lingpipe.plan

(also installed as the `lingpipe-trainer` command). A run in a logdir that holds
checkpoints resumes from the latest one. The logdir receives params.txt (the full
params), params_diff.txt (where they differ from the registered model),
checkpoints/, summaries for TensorBoard in train/ and eval_<dataset>/,
eval_<dataset>.json with the latest evaluation, and with --plan plan_check.json (the
plan's predicted step time and memory against the measured; lingpipe.runners.plan_flags).

One run at a time per logdir: the chief holds the lock `lingpipe.lock` there (its
host, pid and start time) for the whole run; a second run on the same logdir is
refused. SIGTERM or Ctrl-C (SIGINT) ends the current step, saves a checkpoint and
exits with status 3; rerunning the same command resumes from it. A rerun of a run
that reached max_steps completes its final evaluation if that did not happen, and
otherwise says there is nothing to do. The logdir may be any path TensorFlow's
file system knows (local, gs://, ram://).

Exit status, and what SIGTERM or SIGINT (Ctrl-C) does in each phase of a run:
  0    done
  1    training failed: a non-finite loss or weights, a run in which no step
       updated the weights (float16 overflow), unreadable checkpoints, a write
       that fails while the run goes (a full disk), a lost or hung worker
  2    bad command line, params or input (a model too big for the machine
       included), a path of the run taken by something else (params.txt,
       checkpoints/ or run_state.json a directory or a file), or the logdir is in
       use by another run; the message says what was expected
  3    stopped by SIGTERM or SIGINT; rerunning the same command resumes:
       - at start-up (the flags, TensorFlow's import, building and checking the
         model), from taking the logdir's lock to the first step, and in
         --mode=eval or export: at once, the lock released, nothing saved
         ("Stopped by SIGTERM before any step ran; ...")
       - during a step or a checkpoint write: after it, the step saved ("Stopped
         by SIGTERM at step N; saved ckpt-N; ...")
       - during an evaluation between steps: after it and the next step, that
         step saved
       - under a step deadline (--step_timeout_s), when what it waits for (a
         step, a checkpoint write, an evaluation batch) still runs 5 s after the
         signal: without saving ("Stopped by SIGTERM while step N waited ...")
  130  a second SIGTERM or SIGINT in the train loop: interrupted at once, nothing
       saved after the newest checkpoint
A signal during the final evaluation lets it finish (status 0). Once the run has
ended, while it releases the lock and prints its last line, signals are ignored:
its status stands. In the first ~0.15 s, while Python starts and before the
trainer's code runs, a signal has Python's default effect: SIGTERM ends the process
without a message, Ctrl-C prints a KeyboardInterrupt traceback.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import sys
from typing import NamedTuple

from absl import app, flags, logging

from lingpipe import command_line
from lingpipe.pipeline.step import settings
from lingpipe.runners import plan_flags, startup, stop_signals

__all__ = [
    "FLAGS",
    "main",
    "MODES",
    "Run",
    "STRATEGIES",
]

MODES = ("train", "eval", "train_and_eval", "inspect_params", "inspect_model", "export")
STRATEGIES = ("default", "mirrored", "multi_worker", "tpu", "hosts")

FLAGS = flags.FLAGS
flags.DEFINE_string(
    "model", "lm.TransformerLmTiny", "Registered model to run, '<family>.<ClassName>'."
)
flags.DEFINE_string(
    "logdir", None, "Directory of the run: params, checkpoints, summaries, eval results."
)
flags.DEFINE_enum(
    "mode",
    "train_and_eval",
    MODES,
    "train: train to train.max_steps; eval: evaluate the latest checkpoint on every "
    "dataset but Train; train_and_eval: train, evaluating every --eval_interval_steps "
    "and at the end; inspect_params: print the params; inspect_model: print the layer "
    "tree and the pipeline's partition; export: save the latest checkpoint's eval path "
    "as a SavedModel (--export_dir) that TensorFlow alone loads.",
)
flags.DEFINE_enum(
    "precision",
    None,
    ["float32", "bfloat16", "float16"],
    "Compute dtype (sets the task's fprop_dtype); the weights stay float32. float16 "
    "trains with the dynamic loss scale of train.loss_scale.",
)
flags.DEFINE_string(
    "export_dir",
    None,
    "--mode=export: where to write the SavedModel (default <logdir>/export/<step>).",
)
flags.DEFINE_bool(
    "export_single_device",
    False,
    "--mode=export: save the model as one stage on one device instead of pipelined.",
)
flags.DEFINE_string(
    "params_override",
    "",
    "Params to change, in Lingvo's text: 'a.b : 1; c : \"x\"' (';' or newline between "
    "assignments, applied in order after --params_file). Values are literals, never code.",
)
flags.DEFINE_string("params_file", None, "File of 'name : value' lines applied to the params.")
flags.DEFINE_integer("max_steps", None, "Train to this step (sets train.max_steps).")
# --num_stages, --num_micro_batches, --schedule, --num_virtual_stages, --remat,
# --partition, --jit_compile_stages: one per pipeline setting, declared there.
settings.DefineFlags(flags)
plan_flags.DefineFlags(flags)
for _name in (*settings.FLAGS, *plan_flags.FLAGS):
    flags.declare_key_flag(_name)  # defined there, listed by this module's --help
flags.DEFINE_integer(
    "seed", None, "Seed of the initial weights (random_seed) and of the training data order."
)
flags.DEFINE_enum(
    "strategy",
    "default",
    STRATEGIES,
    "tf.distribute strategy: default (one replica on this host), mirrored (replicas "
    "on this host's devices), multi_worker (replicas over the hosts of TF_CONFIG), tpu, "
    "hosts (pipelines whose stages live on the workers of TF_CONFIG, each running "
    "python -m lingpipe.worker; this trainer is the chief; one replica per K of the "
    "workers' devices).",
)
flags.DEFINE_string("tpu", None, "TPU name or address for --strategy=tpu.")
flags.DEFINE_float(
    "collective_timeout_s",
    None,
    "multi_worker: seconds a gradient all-reduce may wait for the other workers before "
    "the run fails (None: wait forever). hosts: seconds to wait for every worker to "
    "answer at start-up (None: 60).",
)
flags.DEFINE_float(
    "step_timeout_s",
    None,
    "Seconds a training step, or a batch of an evaluation, may take before the run fails "
    "naming it (and, with --strategy=hosts, the worker that stopped "
    "answering); the run's first step and each evaluation's first batch, which trace, and "
    "each checkpoint write get 5 times as long. SIGTERM and Ctrl-C work while they wait. "
    "None: 300 under --strategy=hosts, no limit otherwise; 0: no limit.",
)
flags.DEFINE_integer(
    "logical_devices",
    0,
    "Split the CPU into this many logical devices, to pipeline without accelerators. "
    "0: as many as the pipeline's stages need when there is no GPU or TPU. "
    "--strategy=hosts: this client's devices, one per replica it runs (0: 8).",
)
flags.DEFINE_integer("log_interval_steps", 100, "Log the metrics every this many steps (0: never).")
flags.DEFINE_integer(
    "summary_interval_steps", 10, "Write training summaries every this many steps (0: at the end)."
)
flags.DEFINE_integer(
    "checkpoint_interval_steps", 100, "Save a checkpoint every this many steps (0: at the end)."
)
flags.DEFINE_integer("max_checkpoints_to_keep", 5, "How many of the newest checkpoints to keep.")
flags.DEFINE_integer(
    "eval_interval_steps", 0, "In train_and_eval, evaluate every this many steps (0: at the end)."
)
flags.DEFINE_float(
    "progress_interval_seconds", 5.0, "Seconds between progress lines (only on a terminal)."
)
flags.DEFINE_string(
    "profile_steps",
    "",
    "'A,B': record training steps A..B (1-based) with TensorFlow's profiler into the "
    "logdir (TensorBoard's Profile tab), then write the pipeline's measured timeline "
    "to LOGDIR/timeline.json (Chrome trace) and LOGDIR/timeline.png, and print each "
    "device's busy and idle share beside the schedule's simulated idle share.",
)
flags.DEFINE_integer("intra_op_threads", 0, "TensorFlow intra-op threads (0: TF's default).")
flags.DEFINE_integer(
    "inter_op_threads",
    0,
    "TensorFlow inter-op threads (0: TF's default). On CPU, pipeline stages run at once "
    "only with inter_op >= 2.",
)


def _NonNegative(name: str) -> int:
    value = getattr(FLAGS, name)
    if value < 0:
        raise startup.UsageError(f"--{name}: expected an integer >= 0, received {value}")
    return value


def _CheckFlags() -> dict | None:
    """The flags' own values, checked before TensorFlow is imported (which takes seconds),
    so that a bad flag is answered at once; a plan file's flags are set here. What needs
    the model is checked later. Returns the plan file's JSON, or None."""
    plan_file = plan_flags.CheckFlags(FLAGS)
    if plan_file is not None:
        plan_flags.Apply(FLAGS, plan_file["plan"], f"--plan={FLAGS.plan}")
    ints = [s.name for s in settings.SETTINGS if s.flag and s.kind == "int"]
    for name in ("max_steps", *ints):
        value = getattr(FLAGS, name)
        if value is not None and value < 1:
            raise startup.UsageError(f"--{name}: expected a positive integer, received {value}")
    for name in ("remat", "partition"):
        if FLAGS[name].value is not None:
            try:
                settings.FromText(name, FLAGS[name].value)
            except ValueError as e:
                raise startup.UsageError(str(e)) from None
    for name in (
        "log_interval_steps",
        "summary_interval_steps",
        "checkpoint_interval_steps",
        "eval_interval_steps",
        "intra_op_threads",
        "inter_op_threads",
        "logical_devices",
    ):
        _NonNegative(name)
    if FLAGS.step_timeout_s is not None and FLAGS.step_timeout_s < 0:
        raise startup.UsageError(
            f"--step_timeout_s: expected seconds >= 0 (0: no limit), received "
            f"{FLAGS.step_timeout_s:g}"
        )
    if FLAGS.seed is not None and FLAGS.seed < 0:
        raise startup.UsageError(f"--seed: expected an integer >= 0, received {FLAGS.seed}")
    if FLAGS.max_checkpoints_to_keep < 1:
        raise startup.UsageError(
            f"--max_checkpoints_to_keep: expected an integer >= 1, received "
            f"{FLAGS.max_checkpoints_to_keep}"
        )
    _ProfileSteps()
    if FLAGS.mode not in ("inspect_params", "inspect_model") and FLAGS.logdir is None:
        _Logdir()  # raises: --logdir is required
    return plan_file


def _NoteShortSchedule(task_params) -> None:
    """One line when training stops before the learning-rate schedule's end (a
    --max_steps below its total_steps, say): the rate never decays to its last value."""
    train = task_params.train
    schedule = train.lr_schedule
    for field, what in (("total_steps", "decay"), ("warmup_steps", "warmup")):
        length = schedule.Get(field) if field in schedule else None
        if isinstance(length, int) and train.max_steps < length:
            logging.warning(
                "Training stops at step %d, before the learning-rate schedule's %s ends "
                "(train.lr_schedule.%s : %d, %s); to fit it to the run, set "
                "--params_override='train.lr_schedule.%s : %d'",
                train.max_steps,
                what,
                field,
                length,
                schedule.cls.__name__,
                field,
                train.max_steps,
            )
            return


def _Overrides() -> startup.Overrides:
    """What the flags change in the registered params."""
    return startup.Overrides(
        params_file=FLAGS.params_file,
        params_override=FLAGS.params_override,
        max_steps=FLAGS.max_steps,
        seed=FLAGS.seed,
        **{name: FLAGS[name].value for name in settings.FLAGS},
    )


def _SetPrecision(task_params) -> None:
    """--precision into the task's params."""
    if FLAGS.precision is not None:
        from lingpipe.pipeline.step import precision

        task_params.fprop_dtype = precision.ComputeDtype(FLAGS.precision)


def _Export(tasks: list, plan, logdir: str) -> int:
    """--mode=export: the newest checkpoint's eval path as a SavedModel."""
    from lingpipe import export
    from lingpipe.runners import checkpointer

    if plan.checkpoint is None:
        raise startup.UsageError(
            f"--mode=export: no checkpoint in {plan.checkpoint_dir}; train first (--mode=train)"
        )
    step = checkpointer.RestoreLatest(plan.checkpoint_dir, tasks)
    directory = FLAGS.export_dir or f"{logdir}/export/{step}"
    export.Export(tasks[0], directory, single_device=FLAGS.export_single_device)
    logging.info("Exported step %d to %s", step, directory)
    return 0


def _Logdir() -> str | None:
    """The checked --logdir (nothing created yet); None for --mode=inspect_model."""
    if FLAGS.mode == "inspect_model":
        return None
    if FLAGS.logdir is None:
        raise startup.UsageError(
            f"--logdir is required for --mode={FLAGS.mode}: the directory for "
            "checkpoints, summaries and results"
        )
    return startup.CheckLogdir(FLAGS.logdir)


def _Intervals():
    """The train loop's intervals from the flags, checked."""
    from lingpipe.runners import train_loop

    if FLAGS.max_checkpoints_to_keep < 1:
        raise startup.UsageError(
            f"--max_checkpoints_to_keep: expected an integer >= 1, received "
            f"{FLAGS.max_checkpoints_to_keep}"
        )
    return train_loop.Intervals(
        log_steps=_NonNegative("log_interval_steps"),
        summary_steps=_NonNegative("summary_interval_steps"),
        checkpoint_steps=_NonNegative("checkpoint_interval_steps"),
        eval_steps=_NonNegative("eval_interval_steps"),
        progress_seconds=FLAGS.progress_interval_seconds,
    )


class _RunExtras(NamedTuple):
    """What a training run shows beside its curves: the params text (a summary), the
    steps to profile (first, last) or None, and the plan's prediction (--plan) or None."""

    params_text: str
    profile_steps: tuple[int, int] | None
    predicted: dict | None = None


def _ProfileSteps() -> tuple[int, int] | None:
    """--profile_steps as (first, last), checked; None when not set."""
    text = FLAGS.profile_steps.strip()
    if not text:
        return None
    parts = text.split(",")
    try:
        first, last = (int(x) for x in parts) if len(parts) == 2 else (0, -1)
    except ValueError:
        first, last = 0, -1
    if not 1 <= first <= last:
        raise startup.UsageError(
            f"--profile_steps: expected 'A,B' with integers 1 <= A <= B (the first and "
            f"last step to record), received {FLAGS.profile_steps!r}"
        )
    return first, last


def _ResetMemoryPeaks(pipelines: list) -> None:
    """Before the profiled steps: their peak memory is measured from here."""
    from lingpipe.pipeline.observe import memory

    if pipelines and _LocalDevices(pipelines[0]):
        memory.ResetPeaks(pipelines[0].devices)


def _LocalDevices(pipeline) -> bool:
    """Whether the pipeline's stages are all in this process (their memory is readable)."""
    from lingpipe import cluster

    return all(cluster.HostOf(d) == "local" for d in pipeline.devices)


def _WriteTimeline(task, pipelines: list, logdir: str, steps: list[int]) -> None:
    """After profiling: LOGDIR/timeline.json and .png of the first of `pipelines`, the
    measured vs simulated idle share per device, and its partition report with each
    stage's estimated memory beside the peak measured over the profiled steps (per
    device on accelerators; on CPU, one allocator for all, the sum) on stdout."""
    from lingpipe.pipeline.observe import memory, timeline
    from lingpipe.runners import inspect_model

    if not pipelines:
        logging.warning("--profile_steps: the model has no pipeline; only the profile is written")
        return
    sched = pipelines[0].Schedule()
    try:
        spans = timeline.Spans(timeline.ReadXSpace(timeline.LatestProfile(logdir)), sched)
    except timeline.TimelineError as e:
        logging.warning("--profile_steps: no timeline: %s", e)
        return
    json_path, png_path = timeline.Write(logdir, spans, sched)
    print(f"{timeline.Compare(spans, sched)} (steps {steps[0]}..{steps[-1]})", flush=True)
    logging.info("Wrote the measured timeline to %s and %s", json_path, png_path)
    report = pipelines[0].PartitionReport(optimizer=inspect_model.TaskOptimizer(task))
    if _LocalDevices(pipelines[0]):
        report.measured = memory.MeasuredPeaks(pipelines[0].devices)
    print(f"Pipeline {pipelines[0].path} in steps {steps[0]}..{steps[-1]}:\n{report}", flush=True)


def _FindPipelines(layer) -> list:
    """The PipeliningLayers of the layer tree, in tree order."""
    from lingpipe.layers import gpipe

    found = [layer] if isinstance(layer, gpipe.PipeliningLayer) else []
    for child in layer.children.values():
        for c in child if isinstance(child, list) else [child]:
            found += _FindPipelines(c)
    return found


def _SetUpDevices(num_stages: int) -> None:
    """Logical CPU devices and threads; must run before TensorFlow initializes."""
    import tensorflow as tf

    from lingpipe import cluster

    intra, inter = _NonNegative("intra_op_threads"), _NonNegative("inter_op_threads")
    if intra:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
    if inter:
        tf.config.threading.set_inter_op_parallelism_threads(inter)
    n = FLAGS.logical_devices
    has_accelerators = tf.config.list_physical_devices("GPU") or tf.config.list_physical_devices(
        "TPU"
    )
    if n == 0 and FLAGS.strategy == "hosts":
        from lingpipe.runners import hosts

        n = hosts.CLIENT_DEVICES  # one per replica; the stages live on the workers
    if n == 0 and num_stages > 1 and not has_accelerators:
        n = num_stages
    if n:
        try:
            cluster.SetLogicalCpuDevices(n)
        except ValueError as e:
            raise startup.UsageError(f"--logical_devices={FLAGS.logical_devices}: {e}") from None


def _BuildTasks(resolved: startup.ResolvedParams, devices_ready: bool = False):
    """Sets up the devices (unless `devices_ready`: --plan=auto did), builds the
    strategy's layout and its copies of the task.

    Returns (layout, tasks).
    """
    num_stages = resolved.task.num_stages if "num_stages" in resolved.task else 1
    if not devices_ready:
        _SetUpDevices(num_stages)
    import tensorflow as tf

    # TensorFlow's own INFO lines (one per all-reduce traced, per checkpoint shard)
    # would drown the run's log.
    tf.get_logger().setLevel("WARNING")

    from lingpipe.runners import strategies

    layout = strategies.BuildLayout(
        FLAGS.strategy, num_stages, tpu=FLAGS.tpu, collective_timeout_s=FLAGS.collective_timeout_s
    )
    logging.info("%s", layout.Describe())

    def Build():
        try:
            return resolved.task.Instantiate()
        except ValueError as e:
            raise startup.UsageError(f"cannot build the model {FLAGS.model}: {e}") from None

    if FLAGS.strategy in ("default", "mirrored"):  # the stages are on this machine
        from lingpipe.runners import preflight

        preflight.CheckFits(FLAGS.model, resolved.task)
    return layout, layout.BuildTasks(Build)


def _WriteParams(logdir: str, resolved: startup.ResolvedParams) -> None:
    """Creates the logdir and writes params.txt and params_diff.txt (the chief only)."""
    import tensorflow as tf

    tf.io.gfile.makedirs(logdir)
    _, diff = startup.WriteParams(logdir, resolved)
    # One line: the full text is in params.txt and TensorBoard (train/, text "params").
    changed = [line[1:].strip() for line in diff.splitlines() if line.startswith(">")]
    logging.info(
        "Params in %s/%s; %s",
        logdir,
        startup.PARAMS_FILE,
        f"changed from {resolved.key}: {'; '.join(changed)}" if changed else f"as {resolved.key}",
    )


def _Evaluate(layout, tasks: list, plan) -> int:
    """--mode=eval: evaluates the newest readable checkpoint on every eval dataset, each
    batch bounded as a training step is (--step_timeout_s): it reads every weight from
    its device, and a stopped worker would hold it for ever."""
    from lingpipe.runners import checkpointer, step_deadline, train_loop

    step = checkpointer.RestoreLatest(plan.checkpoint_dir, tasks)
    timeout_s = layout.StepTimeout(FLAGS.step_timeout_s)

    def Bound(fn, work: str, first: bool):
        # SIGTERM and Ctrl-C stop the run at once (StopBeforeSteps): this thread waits
        # in short slices, where Python runs its signal handlers.
        try:
            return step_deadline.Call(
                fn, timeout_s * (train_loop.FIRST_STEP_FACTOR if first else 1), lambda: None
            )
        except step_deadline.StepTimeout as e:
            latest = checkpointer.Checkpointer(plan.checkpoint_dir, writable=False).latest
            raise layout.StepHung(work, e.timeout_s, latest) from None

    for evaler in plan.evalers:
        evaler.Evaluate(step, Bound if timeout_s else None)
    return 0


def _Train(layout, tasks: list, plan, logdir: str, intervals, run) -> int:
    """Trains to train.max_steps from the newest checkpoint, evaluating as the mode says.

    `run` holds the run's params text and the steps to profile (see _Run).
    """
    from lingpipe.runners import train_loop

    layout.CreateOptimizers(tasks)
    watch = None
    if run.predicted is not None and layout.is_chief:
        pipelines = _FindPipelines(tasks[0])
        local = pipelines and _LocalDevices(pipelines[0])
        watch = plan_flags.PlanCheck(logdir, run.predicted, pipelines[0].devices if local else None)
    profile = None
    if run.profile_steps is not None:
        pipelines = _FindPipelines(tasks[0])
        done = functools.partial(_WriteTimeline, tasks[0], pipelines)
        begin = functools.partial(_ResetMemoryPeaks, pipelines)
        profile = train_loop.ProfileSteps(*run.profile_steps, done, begin)

    def Evaluate(step: int, bound) -> None:
        for evaler in plan.evalers:
            evaler.Evaluate(step, bound)

    trainer = layout.MakeTrainer(
        tasks,
        plan.train_input,
        logdir,
        intervals=intervals,
        evaluate=Evaluate if plan.evalers else None,
        checkpoint_dir=plan.checkpoint_dir,
        max_to_keep=FLAGS.max_checkpoints_to_keep,
        profile=profile,
        params_text=run.params_text,
        watch=watch,
    )
    trainer.SetStepTimeout(layout.StepTimeout(FLAGS.step_timeout_s))
    from lingpipe.runners.evaler import Results as EvalResults

    trainer.Train()
    logging.info(
        "Done at step %d: %s; weights fingerprint %s",
        trainer.global_step,
        EvalResults(logdir, [e.dataset for e in plan.evalers]),
        train_loop.Fingerprint(tasks[0]),
    )
    return 0


def _Run(plan_file: dict | None = None) -> int:
    """Resolves the params, builds and checks everything the mode needs, and only then
    writes the params to the logdir and runs the mode."""
    from lingpipe.runners import inspect_model, preflight

    resolved = startup.ResolveParams(FLAGS.model, _Overrides())
    predicted, devices_ready = None, False
    if FLAGS.plan is not None:
        resolved, predicted, devices_ready = plan_flags.Prepare(
            FLAGS,
            resolved,
            plan_file,
            set_up_devices=_SetUpDevices,
            resolve=lambda: startup.ResolveParams(FLAGS.model, _Overrides()),
        )
    _SetPrecision(resolved.task)
    if FLAGS.mode == "inspect_params":
        print(resolved.task.ToText(), end="")
        return 0
    logdir = _Logdir()
    intervals = _Intervals()
    profile = _ProfileSteps()
    profile = startup.CheckProfileSteps(profile, resolved.task.train.max_steps, FLAGS.profile_steps)
    run = _RunExtras(resolved.task.ToText(), profile, predicted)
    if FLAGS.mode in ("train", "train_and_eval"):
        _NoteShortSchedule(resolved.task)
    layout, tasks = _BuildTasks(resolved, devices_ready)
    if FLAGS.mode == "inspect_model":
        print(inspect_model.Describe(tasks[0]))
        return 0
    plan = preflight.Prepare(resolved, layout, tasks, logdir, FLAGS.mode, FLAGS.export_dir)
    for path, report in inspect_model.PipelineReports(tasks[0]):
        logging.info("Pipeline %s:\n%s", path, report)
    if traffic := layout.DescribeTraffic(tasks):
        logging.info("%s", traffic)
    if plan.batch_plan:
        logging.info("%s", plan.batch_plan)
    if FLAGS.mode == "export":
        return _Export(tasks, plan, logdir)
    from lingpipe.runners import rundir

    # The chief holds the lock to the end of the run. A `with`, not an ExitStack: Python
    # runs nothing between the lock's __enter__ and the block whose end releases it,
    # so no signal can come in between.
    with rundir.LogdirLock(logdir) if layout.is_chief else contextlib.nullcontext():
        try:
            if layout.is_chief and startup.WritesParams(logdir, FLAGS.mode):
                _WriteParams(logdir, resolved)
            if FLAGS.mode == "eval":
                return _Evaluate(layout, tasks, plan)
            return _Train(layout, tasks, plan, logdir, intervals, run)
        finally:
            # The run has ended, however: a signal now could only add a second line or
            # change the status of what is done.
            stop_signals.Ignore()


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print(
            f"lingpipe.trainer: error: unexpected arguments {argv[1:]}; every setting is a "
            "--flag (see --help)",
            file=sys.stderr,
        )
        return 2
    # First: from here to the train loop (TensorFlow's import included, which takes
    # seconds), SIGTERM and SIGINT stop the run at once with one line, status 3.
    try:
        with stop_signals.StopBeforeSteps():
            return _Main()
    except stop_signals.Stopped as e:
        print(f"lingpipe.trainer: {stop_signals.Original(e)}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print(
            "lingpipe.trainer: interrupted; nothing was saved after the newest checkpoint",
            file=sys.stderr,
        )
        return 130


def _Main() -> int:
    """main's work, under its signal handling: an error that ends the run prints one
    line and becomes the exit status."""
    try:
        plan_file = _CheckFlags()
    except startup.UsageError as e:
        print(f"lingpipe.trainer: error: {e}", file=sys.stderr)
        return 2
    from lingpipe import tf_logs

    tf_logs.ImportTensorFlow()
    from lingpipe.runners import checkpointer, rundir, train_loop

    try:
        return _Run(plan_file)
    except (startup.UsageError, rundir.LogdirLockedError) as e:
        print(f"lingpipe.trainer: error: {e}", file=sys.stderr)
        return 2
    except (
        train_loop.NonFiniteError,
        train_loop.ClusterError,
        checkpointer.CheckpointError,
        rundir.LogdirWriteError,
    ) as e:
        print(f"lingpipe.trainer: error: {e}", file=sys.stderr)
        return 1


def Run() -> None:
    """Entry point of `python -m lingpipe.trainer` and the `lingpipe-trainer` command.

    Exits 2 with one line on a bad flag (absl alone exits 1 with two), 0 after --help.
    """
    # --help lists the main module's flags; for the installed command that module
    # is the launcher script, so these flags are registered as its own.
    for flag in FLAGS.get_key_flags_for_module(__name__):
        FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    # --help prints the main module's docstring: the launcher script has none.
    main_module = sys.modules["__main__"]
    if not getattr(main_module, "__doc__", None):
        main_module.__doc__ = __doc__

    def Main(argv: list[str]) -> None:
        status = main(argv)
        # The run has ended: a late SIGTERM would lose its status (-15), a late Ctrl-C
        # raise in a finalizer while Python tears TensorFlow down and print 'Exception
        # ignored in ... KeyboardInterrupt'.
        stop_signals.Ignore()
        # Python's last garbage collection at exit walks every object TensorFlow made:
        # 3-8 s of silence after the last line on 2 cores. The OS frees them anyway.
        gc.freeze()
        sys.exit(status)

    app.run(Main, flags_parser=command_line.AbslParser("lingpipe.trainer"))


if __name__ == "__main__":
    Run()
