"""The lingpipe trainer: train, evaluate or inspect a registered model.

    python -m lingpipe.trainer --model=lm.TransformerLmTiny --logdir=/tmp/lp
    python -m lingpipe.trainer --model=lm.TransformerLmTiny --logdir=/tmp/lp --mode=eval
    python -m lingpipe.trainer --model=lm.TransformerLmTiny --mode=inspect_model \\
        --num_stages=4 --params_override="num_micro_batches : 8"

(also installed as the `lingpipe-trainer` command). A run in a logdir that holds
checkpoints resumes from the latest one. The logdir receives params.txt (the full
params), params_diff.txt (where they differ from the registered model),
checkpoints/, summaries for TensorBoard in train/ and eval_<dataset>/, and
eval_<dataset>.json with the latest evaluation.

Exit status: 0 done, 1 training failed (non-finite loss, unreadable checkpoints),
2 bad command line or params (the message says what was expected).
"""

from __future__ import annotations

import os
import sys

from absl import app, flags, logging

from lingpipe.runners import startup

MODES = ("train", "eval", "train_and_eval", "inspect_params", "inspect_model")
STRATEGIES = ("default", "mirrored", "multi_worker", "tpu")

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
    "tree and the pipeline's partition.",
)
flags.DEFINE_string(
    "params_override",
    "",
    "Params to change, in Lingvo's text: 'a.b : 1; c : \"x\"' (';' or newline between "
    "assignments, applied in order after --params_file). Values are literals, never code.",
)
flags.DEFINE_string("params_file", None, "File of 'name : value' lines applied to the params.")
flags.DEFINE_integer("max_steps", None, "Train to this step (sets train.max_steps).")
flags.DEFINE_integer("num_stages", None, "Pipeline stages (sets the task's num_stages).")
flags.DEFINE_integer(
    "num_micro_batches", None, "Micro-batches per batch (sets the task's num_micro_batches)."
)
flags.DEFINE_integer(
    "seed", None, "Seed of the initial weights (random_seed) and of the training data order."
)
flags.DEFINE_enum(
    "strategy",
    "default",
    STRATEGIES,
    "tf.distribute strategy: default (one replica on this host), mirrored (replicas "
    "on this host's devices), multi_worker (replicas over the hosts of TF_CONFIG), tpu.",
)
flags.DEFINE_string("tpu", None, "TPU name or address for --strategy=tpu.")
flags.DEFINE_float(
    "collective_timeout_s",
    None,
    "multi_worker: seconds a gradient all-reduce may wait for the other workers before "
    "the run fails (None: wait forever).",
)
flags.DEFINE_integer(
    "logical_devices",
    0,
    "Split the CPU into this many logical devices, to pipeline without accelerators. "
    "0: as many as the pipeline's stages need when there is no GPU or TPU.",
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
    if n == 0 and num_stages > 1 and not has_accelerators:
        n = num_stages
    if n:
        try:
            cluster.SetLogicalCpuDevices(n)
        except ValueError as e:
            raise startup.UsageError(f"--logical_devices={FLAGS.logical_devices}: {e}") from None


def _BuildTask(params):
    try:
        return params.Instantiate()
    except ValueError as e:
        raise startup.UsageError(f"cannot build the model {FLAGS.model}: {e}") from None


def _Run() -> int:
    from lingpipe.runners import checkpointer, evaler, inspect_model, train_loop

    overrides = startup.Overrides(
        params_file=FLAGS.params_file,
        params_override=FLAGS.params_override,
        max_steps=FLAGS.max_steps,
        num_stages=FLAGS.num_stages,
        num_micro_batches=FLAGS.num_micro_batches,
        seed=FLAGS.seed,
    )
    resolved = startup.ResolveParams(FLAGS.model, overrides)
    if FLAGS.mode == "inspect_params":
        print(resolved.task.ToText(), end="")
        return 0
    logdir = None
    if FLAGS.mode != "inspect_model":
        if FLAGS.logdir is None:
            raise startup.UsageError(
                f"--logdir is required for --mode={FLAGS.mode}: the directory for "
                "checkpoints, summaries and results"
            )
        logdir = startup.CheckLogdir(FLAGS.logdir)
    intervals = train_loop.Intervals(
        log_steps=_NonNegative("log_interval_steps"),
        summary_steps=_NonNegative("summary_interval_steps"),
        checkpoint_steps=_NonNegative("checkpoint_interval_steps"),
        eval_steps=_NonNegative("eval_interval_steps"),
        progress_seconds=FLAGS.progress_interval_seconds,
    )
    if FLAGS.max_checkpoints_to_keep < 1:
        raise startup.UsageError(
            f"--max_checkpoints_to_keep: expected an integer >= 1, received "
            f"{FLAGS.max_checkpoints_to_keep}"
        )
    num_stages = resolved.task.num_stages if "num_stages" in resolved.task else 1
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
    tasks = layout.BuildTasks(lambda: _BuildTask(resolved.task))
    task = tasks[0]
    if FLAGS.mode == "inspect_model":
        print(inspect_model.Describe(task))
        return 0
    for path, report in inspect_model.PipelineReports(task):
        logging.info("Pipeline %s:\n%s", path, report)
    micro = resolved.task.num_micro_batches if "num_micro_batches" in resolved.task else 1
    logging.info("%s", layout.BatchPlan(resolved.task.input.batch_size, micro))

    if layout.is_chief:
        os.makedirs(logdir, exist_ok=True)
        text, diff = startup.WriteParams(logdir, resolved)
        logging.info("Params of %s:\n%s", resolved.key, text)
        logging.info("Where they differ from the registered model:\n%s", diff or "(nowhere)\n")

    evalers = []
    for dataset in resolved.eval_datasets:
        eval_input = resolved.EvalTaskParams(dataset).input.Instantiate()
        layout.BatchPlan(eval_input.params.batch_size, micro)
        evalers.append(
            evaler.Evaler(
                tasks,
                layout.strategy,
                eval_input,
                dataset,
                logdir,
                resolved.key,
                is_chief=layout.is_chief,
                num_workers=layout.num_workers,
                replica_context=layout.StageContext(),
            )
        )
    ckpt_dir = os.path.join(logdir, "checkpoints")

    if FLAGS.mode == "eval":
        step = checkpointer.RestoreLatest(ckpt_dir, tasks)
        if step is None:
            raise startup.UsageError(
                f"--mode=eval: no checkpoint in {ckpt_dir}; train first (--mode=train)"
            )
        for e in evalers:
            e.Evaluate(step)
        return 0

    layout.CreateOptimizers(tasks)

    def Evaluate(step: int) -> None:
        for e in evalers:
            e.Evaluate(step)

    trainer = train_loop.Trainer(
        tasks,
        layout.strategy,
        task.CreateInputGenerator(),
        logdir,
        intervals,
        evaluate=Evaluate if FLAGS.mode == "train_and_eval" else None,
        checkpoint_dir=ckpt_dir,
        max_to_keep=FLAGS.max_checkpoints_to_keep,
        is_chief=layout.is_chief,
        apply_in_replica=layout.distributes_variables,
        replica_context=layout.StageContext(),
    )
    metrics = trainer.Train()
    logging.info(
        "Done at step %d: %s; weights fingerprint %s",
        trainer.global_step,
        metrics,
        train_loop.Fingerprint(task),
    )
    return 0


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print(
            f"lingpipe.trainer: error: unexpected arguments {argv[1:]}; every setting is a "
            "--flag (see --help)",
            file=sys.stderr,
        )
        return 2
    from lingpipe.runners import checkpointer, train_loop

    try:
        return _Run()
    except startup.UsageError as e:
        print(f"lingpipe.trainer: error: {e}", file=sys.stderr)
        return 2
    except (
        train_loop.NonFiniteError,
        train_loop.ClusterError,
        checkpointer.CheckpointError,
    ) as e:
        print(f"lingpipe.trainer: error: {e}", file=sys.stderr)
        return 1


def Run() -> None:
    """Entry point of `python -m lingpipe.trainer` and the `lingpipe-trainer` command.

    Exits 2 with one line on a bad flag (absl alone exits 1 with two), 0 after --help.
    """
    # --help lists the main module's flags; for the installed command that module
    # is the launcher script, so these flags are registered as its own.
    for flag in FLAGS.get_flags_for_module(__name__):
        FLAGS.register_key_flag_for_module(sys.argv[0], flag)

    def ParseFlags(argv: list[str]) -> list[str]:
        try:
            return FLAGS(argv)
        except flags.Error as e:
            print(f"lingpipe.trainer: error: {e} (see --help)", file=sys.stderr)
            sys.exit(2)
        except SystemExit as e:
            # Parsing exits by itself only once --help (or --helpfull) has printed
            # the help: a success.
            sys.exit(0 if e.code == 1 else e.code)

    app.run(lambda argv: sys.exit(main(argv)), flags_parser=ParseFlags)


if __name__ == "__main__":
    Run()
