"""The `tf.distribute` strategy of a run and the devices of each replica's pipeline.

GPipe runs model parallelism inside a replica (a pipeline of K stages on K
devices) and data parallelism across replicas. A `Layout` says both, one class
per strategy (`BuildLayout(name, ...)` picks it):

    default        one replica on this host; its stages on the first K devices.
    mirrored       MirroredStrategy: this host's D devices in D // K groups of K, one
                   replica per group (replica r's stage k on device r*K + k).
    multi_worker   MultiWorkerMirroredStrategy over the hosts of TF_CONFIG; each host
                   runs its own replicas over its local devices, as `mirrored` does.
    tpu            TPUStrategy with a DeviceAssignment of K cores per replica
                   (lingpipe.tpu).
    hosts          replicas whose stages live on other hosts: the workers of
                   TF_CONFIG, each running `python -m lingpipe.worker`; this process
                   is the chief, the client of TensorFlow's distributed runtime
                   (lingpipe.runners.hosts). The workers' devices in groups of K,
                   one replica per group, as `mirrored` does with one host's.

On CPU, GPU and multi-worker layouts each local replica has its own copy of the
task, built inside `cluster.ReplicaDevices(group)` so that its pipeline's weights
live on its group's devices (a strategy's mirrored variables would put all of a
replica's weights on one device, which defeats the pipeline). The strategy runs
the replicas, gives each its shard of the input, and all-reduces the gradients;
every copy then applies the same reduced gradients, so the copies stay equal, as
a mirrored variable's copies do.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from lingpipe import cluster
from lingpipe.runners import startup

__all__ = [
    "BuildLayout",
    "DefaultLayout",
    "HostsLayout",
    "Layout",
    "LAYOUTS",
    "MirroredLayout",
    "MultiWorkerLayout",
    "TpuLayout",
]


class Layout(abc.ABC):
    """A strategy and the stage devices of this host's replicas: the base of the layouts.

    A layout builds what differs between strategies: the task copies, their
    optimizers, the train step's Trainer and the Evalers, and a trace of one
    replica's forward that checks the input's shapes against the model.

    Args:
      strategy: the `tf.distribute` strategy that runs the replicas.
      groups: groups[r][k] is the device of stage k of local replica r.
      num_workers, worker_index: the hosts of the run and this one's index.
    """

    name = ""

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        groups: list[list[str]],
        num_workers: int = 1,
        worker_index: int = 0,
    ) -> None:
        self.strategy = strategy
        self.groups = groups
        self.num_workers = num_workers
        self.worker_index = worker_index

    @classmethod
    @abc.abstractmethod
    def Build(cls, num_stages: int, tpu: str | None, collective_timeout_s: float | None) -> Layout:
        """The layout of `num_stages`-stage replicas over this host's devices.

        Raises:
          startup.UsageError: too few devices, no TF_CONFIG, no TPU.
        """

    @property
    def is_chief(self) -> bool:
        """Whether this process writes checkpoints, summaries and results (worker 0)."""
        return self.worker_index == 0

    @property
    def num_replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    @property
    def distributes_variables(self) -> bool:
        """Whether one task's variables are distributed by the strategy (TPU), rather
        than each local replica having its own copy of the task."""
        return False

    def BuildTasks(self, build: Callable[[], Any]) -> list:
        """The local replicas' tasks: `build()` once per device group."""
        tasks = []
        for group in self.groups:
            with cluster.ReplicaDevices(group):
                tasks.append(build())
        return tasks

    def CreateOptimizers(self, tasks: list) -> None:
        for task in tasks:
            task.CreateOptimizer()

    def StageContext(self) -> Callable[[], Any] | None:
        """A factory of the context entered around each replica's forward and backward."""
        return None

    def GradientReduction(self) -> Callable[[list], list]:
        """How a replica averages its gradients with the others' (train_loop)."""
        from lingpipe.runners import train_loop

        return train_loop.ReduceGradients

    def InputContext(self) -> tf.distribute.InputContext:
        """What `distribute_datasets_from_function` tells this worker's input pipeline."""
        return tf.distribute.InputContext(
            num_input_pipelines=self.num_workers,
            input_pipeline_id=self.worker_index,
            num_replicas_in_sync=self.num_replicas,
        )

    def TraceForward(self, task, element_spec: Any) -> None:
        """Traces one replica's `task.FProp` on batches of `element_spec`; nothing runs.

        The layers raise ValueError where the shapes do not fit the model.
        """
        fprop = tf.function(lambda batch: task.FProp(task.theta, batch), autograph=False)
        fprop.get_concrete_function(element_spec)

    def TrainerClass(self) -> Callable[..., Any]:
        """The class of the train loop (train_loop.Trainer or a subclass)."""
        from lingpipe.runners import train_loop

        return train_loop.Trainer

    def StepTimeout(self, flag: float | None) -> float | None:
        """A step's deadline in seconds from --step_timeout_s `flag`, None for no limit:
        a flag of None gives this layout's default (no limit here,
        hosts.DEFAULT_STEP_TIMEOUT_S under hosts), 0 no limit."""
        return flag or None

    def StepHung(self, work: str, timeout_s: float, latest: str | None) -> Exception:
        """The error of `work` that did not finish within `timeout_s` (see train_loop)."""
        from lingpipe.runners import train_loop

        return train_loop.HungError(work, timeout_s, latest)

    def MakeTrainer(self, tasks: list, train_input, logdir: str, **kwargs: Any):
        """The train loop of `tasks` (see train_loop.Trainer for `kwargs`)."""
        return self.TrainerClass()(
            tasks,
            self.strategy,
            train_input,
            logdir,
            is_chief=self.is_chief,
            apply_in_replica=self.distributes_variables,
            replica_context=self.StageContext(),
            reduce_gradients=self.GradientReduction(),
            **kwargs,
        )

    def MakeEvaler(self, tasks: list, eval_input, dataset: str, logdir: str, model_key: str):
        """The evaluation of `tasks` on `eval_input` (see evaler.Evaler)."""
        from lingpipe.runners import evaler

        return evaler.Evaler(
            tasks,
            self.strategy,
            eval_input,
            dataset,
            logdir,
            model_key,
            is_chief=self.is_chief,
            num_workers=self.num_workers,
            replica_context=self.StageContext(),
        )

    def DescribeTraffic(self, tasks: list) -> str | None:
        """A line on what the replicas' gradient averaging sends between hosts, if any."""
        return None

    def Describe(self) -> str:
        head = (
            f"strategy={self.name}: {self.num_replicas} replica(s) of {len(self.groups[0])} "
            f"stage(s)"
        )
        if self.num_workers > 1:
            head += f" over {self.num_workers} workers; this is worker {self.worker_index}"
        return head + "\n" + cluster.DescribeGroups(self.groups, cluster.AvailableDevices())

    def BatchPlan(self, global_batch: int, num_micro_batches: int) -> str:
        """How the global batch splits over replicas and micro-batches.

        Raises:
          startup.UsageError: the global batch is not divisible by the replicas, or a
            replica's batch has fewer examples than micro-batches.
        """
        replicas = self.num_replicas
        if global_batch % replicas:
            raise startup.UsageError(
                f"the global batch of {global_batch} examples cannot be split evenly over "
                f"{replicas} replicas; set input.batch_size to a multiple of {replicas} "
                f"(e.g. {replicas * max(1, round(global_batch / replicas))})"
            )
        per_replica = global_batch // replicas
        if num_micro_batches > per_replica:
            raise startup.UsageError(
                f"num_micro_batches={num_micro_batches}: expected at most the {per_replica} "
                f"examples of a replica's batch (input.batch_size={global_batch} over "
                f"{replicas} replica(s)); lower num_micro_batches or raise input.batch_size"
            )
        base, extra = divmod(per_replica, num_micro_batches)
        sizes = f"{num_micro_batches} micro-batches of {base}"
        if extra:
            rest = num_micro_batches - extra
            sizes = f"{extra} micro-batch(es) of {base + 1} and {rest} of {base}"
        return (
            f"global batch {global_batch} = {replicas} replica(s) x {per_replica}; each "
            f"replica pipelines {sizes}"
        )


class DefaultLayout(Layout):
    """One replica on this host; its stages on the first K devices."""

    name = "default"

    @classmethod
    def Build(cls, num_stages: int, tpu: str | None, collective_timeout_s: float | None) -> Layout:
        try:
            groups = [cluster.StageDevices(num_stages)]
        except ValueError as e:
            raise startup.UsageError(f"--num_stages={num_stages}: {e}") from None
        return cls(tf.distribute.get_strategy(), groups)


class MirroredLayout(Layout):
    """MirroredStrategy over this host's devices in groups of K, one replica per group."""

    name = "mirrored"

    @classmethod
    def Build(cls, num_stages: int, tpu: str | None, collective_timeout_s: float | None) -> Layout:
        try:
            groups = cluster.ReplicaDeviceGroups(num_stages)
        except ValueError as e:
            raise startup.UsageError(f"--strategy=mirrored: {e}") from None
        return cls(tf.distribute.MirroredStrategy(devices=[g[0] for g in groups]), groups)


def _Worker() -> tuple[int, int]:
    """(number of workers, this worker's index) from TF_CONFIG."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        raise startup.UsageError(
            "--strategy=multi_worker reads the cluster from the TF_CONFIG environment "
            'variable, which is not set; expected e.g. TF_CONFIG=\'{"cluster": {"worker": '
            '["host0:12345", "host1:12345"]}, "task": {"type": "worker", '
            '"index": 0}}\''
        )
    expected = "expected {'cluster': {'worker': [...]}, 'task': {'type': 'worker', 'index': i}}"
    try:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        workers = resolver.cluster_spec().as_dict().get("worker", [])
        task_type, index = resolver.task_type, resolver.task_id
    except (ValueError, KeyError, TypeError) as e:
        raise startup.UsageError(
            f"--strategy=multi_worker: TF_CONFIG={raw!r} cannot be read "
            f"({type(e).__name__}: {e}); {expected}"
        ) from None
    if task_type != "worker" or index is None or not 0 <= index < len(workers):
        raise startup.UsageError(
            f"--strategy=multi_worker: in TF_CONFIG={raw!r} this process's task "
            f"({task_type!r}, {index!r}) is not one of the {len(workers)} workers; {expected}"
        )
    return len(workers), index


class _LocalReplicasResolver(tf.distribute.cluster_resolver.TFConfigClusterResolver):
    """TF_CONFIG's cluster, reporting one accelerator per local pipeline replica.

    MultiWorkerMirroredStrategy makes one replica per reported GPU; a replica here
    is a group of num_stages GPUs, so the strategy must see the number of groups.
    """

    def __init__(self, num_local_replicas: int) -> None:
        super().__init__()
        self._num_local_replicas = num_local_replicas

    def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
        return {"GPU": self._num_local_replicas}


class MultiWorkerLayout(Layout):
    """MultiWorkerMirroredStrategy over the hosts of TF_CONFIG; each host runs its own
    replicas over its local devices, as `mirrored` does."""

    name = "multi_worker"

    @classmethod
    def Build(cls, num_stages: int, tpu: str | None, collective_timeout_s: float | None) -> Layout:
        num_workers, index = _Worker()
        # The strategy configures collective ops, which must happen before TensorFlow
        # initializes its devices: build it before listing any logical device.
        gpus = tf.config.list_physical_devices("GPU")
        local_replicas = len(gpus) // num_stages if gpus else 1
        if gpus and local_replicas < 1:
            raise startup.UsageError(
                f"--strategy=multi_worker: {num_stages} stages need {num_stages} GPUs per "
                f"worker, this worker has {len(gpus)}"
            )
        options = tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=collective_timeout_s
        )
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=_LocalReplicasResolver(local_replicas) if gpus else None,
            communication_options=options,
        )
        try:
            if gpus:
                devices = cluster.AvailableDevices("GPU")
                groups = cluster.ReplicaDeviceGroups(num_stages, local_replicas, devices)
            else:  # One replica per CPU host: MultiWorkerMirroredStrategy uses CPU:0 only.
                groups = [cluster.StageDevices(num_stages)]
        except ValueError as e:
            raise startup.UsageError(f"--strategy=multi_worker: {e}") from None
        return cls(strategy, groups, num_workers=num_workers, worker_index=index)


class TpuLayout(Layout):
    """TPUStrategy with a DeviceAssignment of K cores per replica (lingpipe.tpu).

    One task, built under the strategy's scope: the strategy distributes its
    variables, and each replica applies the reduced gradients itself.
    """

    name = "tpu"

    @classmethod
    def Build(cls, num_stages: int, tpu: str | None, collective_timeout_s: float | None) -> Layout:
        from lingpipe import tpu as tpu_lib

        try:
            strategy, assignment = tpu_lib.BuildTpuStrategy(tpu, num_stages)
        except ValueError as e:
            raise startup.UsageError(f"--strategy=tpu --tpu={tpu}: {e}") from None
        groups = [
            [c.tpu_device for c in tpu_lib.StageCores(assignment, r)]
            for r in range(assignment.num_replicas)
        ]
        return cls(strategy, groups)

    @property
    def distributes_variables(self) -> bool:
        return True

    def BuildTasks(self, build: Callable[[], Any]) -> list:
        """One task, built under the strategy's scope on the first replica's cores."""
        with self.strategy.scope(), cluster.ReplicaDevices(self.groups[0]):
            return [build()]

    def CreateOptimizers(self, tasks: list) -> None:
        with self.strategy.scope():
            super().CreateOptimizers(tasks)

    def StageContext(self) -> Callable[[], Any] | None:
        """A factory of the context that puts stage k on logical core k."""
        from lingpipe import tpu as tpu_lib
        from lingpipe.pipeline.step import placement

        strategy, devices = self.strategy, self.groups[0]

        def Assign(tensor: tf.Tensor, core: int) -> tf.Tensor:
            return tpu_lib.AssignToStage(strategy, tensor, core)

        return lambda: placement.LogicalCores(Assign, devices)

    def TraceForward(self, task, element_spec: Any) -> None:
        """Traces the forward inside a replica, where the stages' core assignment works."""
        context = self.StageContext()

        def Replica(batch):
            with context():
                return task.FProp(task.theta, batch)

        step = tf.function(lambda batch: self.strategy.run(Replica, args=(batch,)), autograph=False)
        step.get_concrete_function(element_spec)


class HostsLayout(Layout):
    """Replicas whose stages live on the workers of TF_CONFIG (lingpipe.runners.hosts).

    This process is the chief: it connects to the workers, and their devices, in
    order (worker 0's first), make groups of K: stage k of replica r on the k-th
    device of group r, so a replica's pipeline may cross hosts. It reads the data
    and writes the checkpoints, summaries and results. With several groups,
    MirroredStrategy runs one replica per group on this client's own CPU devices
    (a replica's stages are placed on its workers; only its batch, loss and
    metrics stay here), and each gradient is averaged where replica 0's copy of it
    lives (train_loop.ReduceOnGradientDevices), so gradients travel between the
    workers and never through the client. The client offers one CPU device per
    replica it can run (trainer: --logical_devices, default hosts.CLIENT_DEVICES);
    groups beyond that stay idle, and Describe says so. `collective_timeout_s`
    bounds the wait for the workers at start-up (default hosts.DEFAULT_TIMEOUT_S).
    """

    name = "hosts"

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        groups: list[list[str]],
        cluster_spec,
        idle_groups: int = 0,
    ) -> None:
        super().__init__(strategy, groups)
        self.cluster = cluster_spec
        self.idle_groups = idle_groups

    @classmethod
    def Build(cls, num_stages: int, tpu: str | None, collective_timeout_s: float | None) -> Layout:
        from lingpipe.runners import hosts

        timeout_s = collective_timeout_s or hosts.DEFAULT_TIMEOUT_S
        try:
            cluster_spec = hosts.ReadCluster(os.environ.get("TF_CONFIG"))
            task_devices = hosts.Connect(cluster_spec, timeout_s)
            groups = hosts.StageGroups(task_devices, num_stages)
        except ValueError as e:
            raise startup.UsageError(f"--strategy=hosts: {e}") from None
        client = cluster.AvailableDevices("CPU")
        replicas = max(1, min(len(groups), len(client)))
        if replicas == 1:
            strategy = tf.distribute.get_strategy()
        else:
            # The metrics' and the stop flag's all-reduce (scalars) runs on this client;
            # the gradients' runs on the workers (GradientReduction). Not the collective
            # all-reduce: a connected client's collective executor does not find its own
            # devices under the job name the connection gave them.
            strategy = tf.distribute.MirroredStrategy(
                devices=client[:replicas],
                cross_device_ops=tf.distribute.ReductionToOneDevice(client[0]),
            )
        return cls(strategy, groups[:replicas], cluster_spec, len(groups) - replicas)

    def GradientReduction(self) -> Callable[[list], list]:
        from lingpipe.runners import train_loop

        return train_loop.ReduceOnGradientDevices

    def DescribeTraffic(self, tasks: list) -> str | None:
        from lingpipe.runners import hosts

        if len(tasks) < 2:
            return None
        copies = [
            [(v.device, v.shape.num_elements() * v.dtype.size) for v in t.trainable_variables]
            for t in tasks
        ]
        kib = hosts.GradientTraffic(copies) / 1024
        return (
            f"{len(tasks)} replicas: averaging their gradients on replica 0's stage devices "
            f"moves {kib:.1f} KiB between hosts per step (each other replica's gradients "
            "there, the means back)"
        )

    def StepTimeout(self, flag: float | None) -> float | None:
        from lingpipe.runners import hosts

        return hosts.DEFAULT_STEP_TIMEOUT_S if flag is None else flag or None

    def StepHung(self, work: str, timeout_s: float, latest: str | None) -> Exception:
        from lingpipe.runners import hosts

        return hosts.HungError(self.cluster, work, timeout_s, latest)

    def TrainerClass(self) -> Callable[..., Any]:
        from lingpipe.runners import hosts

        cluster_spec = self.cluster
        return lambda *args, **kwargs: hosts.HostsTrainer(*args, cluster=cluster_spec, **kwargs)

    def Describe(self) -> str:
        from lingpipe.runners import hosts

        used = {hosts.Task(d) for group in self.groups for d in group}
        text = (
            f"strategy=hosts: {len(self.groups)} replica(s) of {len(self.groups[0])} stage(s) "
            f"over {len(used)} of the {len(self.cluster.workers)} worker(s); this process is "
            f"the chief {self.cluster.chief}"
        )
        if len(self.groups) > 1:
            text += "; gradients are averaged on replica 0's stage devices"
        if self.idle_groups:
            text += (
                f"; {self.idle_groups} more group(s) of {len(self.groups[0])} devices stay "
                f"idle: this client offers {len(self.groups)} CPU device(s), one per replica "
                f"(--logical_devices={len(self.groups) + self.idle_groups} runs them all)"
            )
        return text + "\n" + hosts.DescribeStages(self.groups, self.cluster)


LAYOUTS = {
    layout.name: layout
    for layout in (DefaultLayout, MirroredLayout, MultiWorkerLayout, TpuLayout, HostsLayout)
}


def BuildLayout(
    name: str,
    num_stages: int,
    tpu: str | None = None,
    collective_timeout_s: float | None = None,
) -> Layout:
    """The layout `name` with this host's replica device groups (see the module docstring).

    Raises:
      startup.UsageError: unknown strategy, too few devices, no TF_CONFIG, no TPU.
    """
    if name not in LAYOUTS:
        raise startup.UsageError(f"--strategy={name}: expected one of {', '.join(LAYOUTS)}")
    return LAYOUTS[name].Build(num_stages, tpu, collective_timeout_s)
