"""BaseTask: a model with its loss and training recipe; SingleTaskModel: a model of one task.

A task is a layer whose FProp maps an input batch to metrics. A subclass defines
the network's output and the loss:

    class Regression(base_task.BaseTask):

      def __init__(self, params):
        super().__init__(params)
        self.CreateChild('proj', linear.LinearLayer.Params().Set(input_dims=4, output_dims=1))

      def ComputePredictions(self, theta, input_batch):
        return self.proj.FProp(theta.proj, input_batch.x)             # [batch, 1]

      def ComputeLoss(self, theta, predictions, input_batch):
        loss = tf.reduce_mean(tf.square(predictions - input_batch.y))
        return NestedMap(loss=(loss, tf.cast(tf.shape(predictions)[0], tf.float32)))

Every metric is a `(value, weight)` pair of scalars, the weight saying how much the
value counts when averaged over batches (e.g. the number of examples); `loss` is the
one that is minimised. Training, as the train loop drives it:

    task = p.Instantiate()
    task.CreateOptimizer()                  # eagerly: slots beside their variables
    train_step = tf.function(task.TrainStep)
    metrics = train_step(batch, step)       # loss, grad_norm, learning_rate, ...

`TrainStep` takes gradients of `loss` (plus the L2 term) with a tape, clips them by
their global norm, and applies them with rate `p.train.learning_rate *
schedule.Value(step)`. The task tracks its optimizer, so `tf.train.Checkpoint(
task=task)` saves the optimizer's slots beside the weights.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from lingpipe import asserts, base_layer, hyperparams, loss_scale, lr_schedules, optimizers, seeds
from lingpipe.layers import gpipe
from lingpipe.nested_map import NestedMap
from lingpipe.pipeline.step import settings

__all__ = [
    "BaseTask",
    "DefinePipelineParams",
    "LpRegularizedVariables",
    "PipelineLayerParams",
    "SingleTaskModel",
]


def _TrainParams() -> hyperparams.Params:
    p = hyperparams.Params()
    p.Define("optimizer", optimizers.Adam.Params(), "Params of the optimizer.")
    p.Define("learning_rate", 1e-3, "Base learning rate; the schedule multiplies it.")
    p.Define("lr_schedule", lr_schedules.Constant.Params(), "Params of the learning-rate schedule.")
    p.Define(
        "clip_gradient_norm_to_value",
        0.0,
        "If > 0, gradients are scaled down so that their global norm is at most this.",
    )
    p.Define(
        "l2_regularizer_weight",
        0.0,
        "Weight of the L2 term weight * sum(w^2) / 2 over the trainable variables of "
        "layers that do not set skip_lp_regularization.",
    )
    p.Define("max_steps", 1000, "Number of training steps.")
    p.Define(
        "loss_scale",
        loss_scale.DynamicLossScale.Params(),
        "Loss scaling of float16 training, used when the task's fprop_dtype is float16 "
        "(None: none): the loss is multiplied by a scale before the backward; a step "
        "whose gradients are not finite is skipped and the scale lowered.",
    )
    return p


def _EvalParams() -> hyperparams.Params:
    p = hyperparams.Params()
    p.Define("samples_per_summary", 1000, "Examples to evaluate for one eval summary.")
    return p


def _Scaled(g: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
    """g * factor on g's device."""
    with tf.device(g.device):
        return g * tf.cast(factor, g.dtype)


def _CheckNonNegative(value: Any, name: str, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{where}: expected {name} >= 0, received {name}={value!r}")


def LpRegularizedVariables(layer: base_layer.BaseLayer) -> list[tf.Variable]:
    """Trainable variables of `layer`'s tree whose layer does not set skip_lp_regularization."""
    found: dict[Any, tf.Variable] = {}

    def Visit(node: base_layer.BaseLayer) -> None:
        if not node.params.skip_lp_regularization:
            for v in node.vars.values():
                if isinstance(v, tf.Variable) and v.trainable:
                    found.setdefault(v.ref(), v)
        for child in node.children.values():
            for c in child if isinstance(child, list) else [child]:
                Visit(c)

    Visit(layer)
    return list(found.values())


def DefinePipelineParams(p: hyperparams.Params) -> hyperparams.Params:
    """Defines the pipeline knobs every pipelined task has (and the trainer's flags set):
    lingpipe.pipeline.step.settings.TASK, each with its one default and doc line."""
    for name in settings.TASK:
        settings.Define(p, name)
    return p


def PipelineLayerParams(
    p: hyperparams.Params, cells: list, input_shapes: Any = None
) -> hyperparams.InstantiableParams:
    """The params of a task's `pipeline` child: `cells` cut by the knobs of
    DefinePipelineParams (settings.TASK: num_stages, num_micro_batches, schedule, ...)."""
    knobs = {name: p.Get(name) for name in settings.TASK if name in p}
    return gpipe.PipeliningLayer.Params().Set(
        name="pipeline", cell_tpl=cells, input_shapes=input_shapes, **knobs
    )


class BaseTask(base_layer.BaseLayer):
    """A layer that computes metrics from an input batch and knows how it is trained."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define(
            "input",
            None,
            "Params of the input generator; model_registry.GetParams sets them. May be None.",
        )
        p.Define("train", _TrainParams(), "How the task is trained.")
        p.Define("eval", _EvalParams(), "How the task is evaluated.")
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        tp = self.params.train
        where = self.path
        asserts.Gt(tp.learning_rate, 0, "train.learning_rate", where=where)
        _CheckNonNegative(
            tp.clip_gradient_norm_to_value, "train.clip_gradient_norm_to_value", where
        )
        _CheckNonNegative(tp.l2_regularizer_weight, "train.l2_regularizer_weight", where)
        asserts.Positive(tp.max_steps, "train.max_steps", where=where)
        # object.__setattr__: plain Python state that tf.Module must not track.
        object.__setattr__(self, "_lr_schedule", tp.lr_schedule.Instantiate())
        object.__setattr__(self, "_optimizer", None)
        object.__setattr__(self, "_loss_scale", None)
        if tp.loss_scale is not None and self.fprop_dtype == tf.float16:
            with tf.init_scope():
                scale = tp.loss_scale.Instantiate()
            object.__setattr__(self, "_loss_scale", scale)
            self._track_trackable(scale, name="loss_scale")

    # ---- What subclasses define ----------------------------------------------

    def ComputePredictions(self, theta: NestedMap, input_batch: NestedMap) -> Any:
        """The network's output for `input_batch` (any structure ComputeLoss takes)."""
        raise TypeError(
            f"{type(self).__name__} must define ComputePredictions(self, theta, input_batch)"
        )

    def ComputeLoss(self, theta: NestedMap, predictions: Any, input_batch: NestedMap) -> NestedMap:
        """NestedMap of metrics, each a (value, weight) pair of scalars; `loss` is required."""
        raise TypeError(
            f"{type(self).__name__} must define ComputeLoss(self, theta, predictions, "
            "input_batch), returning NestedMap(loss=(value, weight), ...)"
        )

    # ---- Forward ---------------------------------------------------------------

    def _CheckMetrics(self, metrics: Any) -> NestedMap:
        where = f"{self.path}: ComputeLoss"
        if not isinstance(metrics, dict):
            raise ValueError(
                f"{where} must return a NestedMap of (value, weight) pairs, received "
                f"{type(metrics).__name__}"
            )
        if "loss" not in metrics:
            raise ValueError(
                f"{where} must return a metric named 'loss' (the value to minimise), "
                f"received metrics {sorted(metrics)}"
            )
        bad = sorted(
            k for k, v in metrics.items() if not isinstance(v, (tuple, list)) or len(v) != 2
        )
        if bad:
            raise ValueError(
                f"{where} must return each metric as a (value, weight) pair, received "
                + ", ".join(f"{k}={metrics[k]!r}" for k in bad)
            )
        loss_rank = tf.convert_to_tensor(metrics["loss"][0]).shape.rank
        if loss_rank not in (None, 0):
            raise ValueError(
                f"{where}: expected loss to be a scalar, received a value of rank {loss_rank}"
            )
        return NestedMap({k: tuple(v) for k, v in metrics.items()})

    def FProp(self, theta: NestedMap, input_batch: NestedMap) -> NestedMap:
        """Metrics of `input_batch`: NestedMap of (value, weight) pairs with `loss`."""
        if input_batch is None:
            raise ValueError(
                f"{self.path}: FProp received input_batch=None; expected the batch from "
                "the input generator (task.CreateInputGenerator())"
            )
        predictions = self.ComputePredictions(theta, input_batch)
        return self._CheckMetrics(self.ComputeLoss(theta, predictions, input_batch))

    # ---- Input and optimizer -------------------------------------------------

    def CreateInputGenerator(self) -> Any:
        """Instantiates `p.input`."""
        if self.params.input is None:
            raise ValueError(
                f"{self.path}: params.input is not set, so there is no input to create; "
                "model_registry.GetParams(key, dataset) sets it, or set "
                "task_params.input = SomeInput.Params()"
            )
        return self.params.input.Instantiate()

    def CreateOptimizer(self) -> optimizers.BaseOptimizer:
        """Instantiates p.train.optimizer and builds it on the trainable variables, eagerly."""
        if self._optimizer is not None:
            raise ValueError(f"{self.path}: CreateOptimizer() was already called")
        with tf.init_scope():
            opt = self.params.train.optimizer.Instantiate()
            opt.Build(self.trainable_variables)
        object.__setattr__(self, "_optimizer", opt)
        self._track_trackable(opt, name="optimizer")
        return opt

    @property
    def optimizer(self) -> optimizers.BaseOptimizer:
        """The optimizer of CreateOptimizer()."""
        if self._optimizer is None:
            raise ValueError(
                f"{self.path}: no optimizer yet; call task.CreateOptimizer() once, eagerly, "
                "before the first TrainStep (slots made while tracing land on CPU:0)"
            )
        return self._optimizer

    @property
    def loss_scale(self) -> loss_scale.DynamicLossScale | None:
        """The dynamic loss scale of p.train.loss_scale (checkpointed with the task), or None."""
        return self._loss_scale

    @property
    def lr_schedule(self) -> lr_schedules.BaseSchedule:
        """The learning-rate schedule of p.train.lr_schedule."""
        return self._lr_schedule

    # ---- Steps -----------------------------------------------------------------

    def _L2Term(self) -> tf.Tensor:
        """l2_regularizer_weight * sum(w^2) / 2 over the regularised variables."""
        terms = []
        for v in LpRegularizedVariables(self):
            with tf.device(v.device):
                terms.append(tf.nn.l2_loss(tf.cast(v, tf.float32)))
        total = tf.add_n(terms) if terms else tf.zeros([], tf.float32)
        return self.params.train.l2_regularizer_weight * total

    def PipelineInputs(self, theta: NestedMap, input_batch: NestedMap) -> tuple | None:
        """A task whose network is `self.pipeline` returns the pipeline's inputs (a
        tuple of its FProp's args) here, and ComputePredictions is
        `self.pipeline.FProp(theta.pipeline, *self.PipelineInputs(...))`. Training then
        goes through the pipeline's schedule (PipeliningLayer.ForwardBackward), with
        ComputeLoss run per micro-batch on the last stage (its metrics must be weighted
        means, as (value, weight) pairs are). Tasks that do not override it are
        differentiated with a tape around FProp."""
        return None

    def ComputeGradients(
        self, input_batch: NestedMap, step: int | tf.Tensor
    ) -> tuple[NestedMap, list[tf.Tensor | None]]:
        """The metrics of `input_batch` and the gradients of its loss, one per variable.

        The forward runs inside `seeds.StepSeedScope(step)`, so dropout draws new
        masks each step. When the L2 weight is > 0 the metrics hold `l2_loss`, which
        is added to `loss` for the gradients but not to the `loss` metric. The
        gradients follow `self.trainable_variables`. Under a `tf.distribute`
        strategy this is one replica's share: reduce the gradients over the
        replicas before `ApplyGradients`.
        """
        tp = self.params.train
        if type(self).PipelineInputs is not BaseTask.PipelineInputs:
            return self._ScheduledGradients(input_batch, step)
        with seeds.StepSeedScope(step), tf.GradientTape() as tape:
            metrics = self.FProp(self.theta, input_batch)
            loss = metrics.loss[0]
            if tp.l2_regularizer_weight > 0:
                l2_loss = self._L2Term()
                metrics.l2_loss = (l2_loss, tf.ones([], tf.float32))
                loss = loss + tf.cast(l2_loss, loss.dtype)
            if self._loss_scale is not None:
                loss = tf.cast(loss, tf.float32) * self._loss_scale.value
        grads = tape.gradient(loss, self.trainable_variables)
        if self._loss_scale is not None:
            inverse = 1.0 / self._loss_scale.value
            grads = [None if g is None else _Scaled(g, inverse) for g in grads]
        return metrics, grads

    def _ScheduledGradients(
        self, input_batch: NestedMap, step: int | tf.Tensor
    ) -> tuple[NestedMap, list[tf.Tensor | None]]:
        """ComputeGradients of a pipelined task: the pipeline's executor differentiates
        the stages and the per-micro-batch losses; a tape covers only what comes before
        the pipeline (a tied embedding, say), from the gradient of the pipeline's inputs."""
        pipeline = self.pipeline
        with seeds.StepSeedScope(step):
            with tf.GradientTape() as tape:
                inputs = self.PipelineInputs(self.theta, input_batch)

            def LossFn(predictions: Any, batch: NestedMap) -> NestedMap:
                return self._CheckMetrics(self.ComputeLoss(self.theta, predictions, batch))

            scale = None if self._loss_scale is None else self._loss_scale.value
            out = pipeline.ForwardBackward(
                self.theta.pipeline, inputs, LossFn, input_batch, loss_scale=scale
            )
        grads: dict = dict(out.variable_grads)

        def Add(v: Any, g: Any) -> None:
            if g is not None and isinstance(v, tf.Variable):
                grads[v.ref()] = g if v.ref() not in grads else grads[v.ref()] + g

        for v, g in zip(tf.nest.flatten(self.theta.pipeline), tf.nest.flatten(out.theta_grads)):
            Add(v, g)
        pairs = [
            (x, g)
            for x, g in zip(tf.nest.flatten(inputs), tf.nest.flatten(out.input_grads))
            if g is not None
        ]
        outside = [v for v in tape.watched_variables() if v.trainable]
        if pairs and outside:
            with tf.device(pipeline.devices[0]), tf.name_scope("before_pipeline_grad"):
                before = tape.gradient(
                    [x for x, _ in pairs], outside, output_gradients=[g for _, g in pairs]
                )
            for v, g in zip(outside, before):
                Add(v, tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g)
        metrics = NestedMap(out.metrics)
        if self.params.train.l2_regularizer_weight > 0:
            metrics.l2_loss = (self._L2Term(), tf.ones([], tf.float32))
            for v in LpRegularizedVariables(self):
                with tf.device(v.device):  # d/dv of weight * |v|^2 / 2
                    Add(v, self.params.train.l2_regularizer_weight * tf.convert_to_tensor(v))
        return metrics, [grads.get(v.ref()) for v in self.trainable_variables]

    def ApplyGradients(self, grads: list[tf.Tensor | None], step: int | tf.Tensor) -> NestedMap:
        """Clips `grads` by their global norm and applies them at the step's rate.

        Returns NestedMap(grad_norm, learning_rate) as (value, weight) pairs:
        `grad_norm` is the global norm before clipping. With a loss scale (float16)
        the update is applied only if every gradient is finite, and the metrics also
        hold `loss_scale` (the scale the step used) and `skipped_step` (1.0 when the
        gradients were not finite and nothing was applied, else 0.0).
        """
        tp = self.params.train
        # Each gradient's share of the norm, and its clipping, on the gradient's own
        # device: a pipeline's gradients never travel to one device for this.
        squares = []
        for g in grads:
            if g is not None:
                with tf.device(g.device):
                    squares.append(tf.reduce_sum(tf.square(tf.cast(g, tf.float32))))
        grad_norm = tf.sqrt(tf.add_n(squares)) if squares else tf.zeros([], tf.float32)
        clip = tp.clip_gradient_norm_to_value
        if clip > 0:
            scale = clip * tf.minimum(1.0 / grad_norm, 1.0 / clip)
            grads = [None if g is None else _Scaled(g, scale) for g in grads]
        learning_rate = tp.learning_rate * self._lr_schedule.Value(step)
        one = tf.ones([], tf.float32)
        metrics = NestedMap(grad_norm=(grad_norm, one), learning_rate=(learning_rate, one))
        if self._loss_scale is None:
            self.optimizer.Apply(grads, self.trainable_variables, learning_rate)
        else:
            metrics.update(self._ApplyIfFinite(grads, learning_rate))
        return metrics

    def _ApplyIfFinite(self, grads: list, learning_rate: tf.Tensor) -> NestedMap:
        """The loss-scaled update: applies `grads` only if all are finite, then lowers
        or raises the loss scale (lingpipe.loss_scale)."""
        finite = loss_scale.AllFinite(grads)
        used = tf.identity(self._loss_scale.value)

        def Apply() -> tf.Tensor:
            self.optimizer.Apply(grads, self.trainable_variables, learning_rate)
            return tf.constant(True)

        applied = tf.cond(finite, Apply, lambda: tf.constant(False))
        with tf.control_dependencies([applied]):
            self._loss_scale.Update(finite)
        one = tf.ones([], tf.float32)
        skipped = 1.0 - tf.cast(applied, tf.float32)
        return NestedMap(loss_scale=(used, one), skipped_step=(skipped, one))

    def TrainStep(self, input_batch: NestedMap, step: int | tf.Tensor) -> NestedMap:
        """One training step on one replica (run it inside a tf.function).

        `ComputeGradients`, then `ApplyGradients`; returns the metrics of both. The
        trainer reduces the gradients over replicas in between; this is the
        single-replica step.

        Args:
          input_batch: NestedMap of the batch's tensors.
          step: 0-based step, python int or integer scalar tensor.
        """
        self.optimizer  # noqa: B018 (raises the clear error before any tracing work)
        metrics, grads = self.ComputeGradients(input_batch, step)
        metrics.update(self.ApplyGradients(grads, step))
        return metrics

    def EvalStep(self, input_batch: NestedMap) -> NestedMap:
        """Metrics of `input_batch` in eval mode (no dropout; batch norm's moving stats)."""
        with base_layer.EvalMode():
            return self.FProp(self.theta, input_batch)


class SingleTaskModel(base_layer.BaseLayer):
    """A model of one task: its child `task`, built from the task params."""

    @classmethod
    def Params(
        cls, task_params: hyperparams.InstantiableParams | None = None
    ) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.name = "model"
        p.Define("task", task_params, "Params of the task (a BaseTask subclass).")
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        task = p.task
        if not isinstance(task, hyperparams.InstantiableParams) or not (
            isinstance(task.cls, type) and issubclass(task.cls, BaseTask)
        ):
            received = "None" if task is None else type(task).__name__
            if isinstance(task, hyperparams.InstantiableParams):
                received += f" for {task.cls!r}"
            raise ValueError(
                f"{self.path}: expected params.task to be the params of a BaseTask "
                f"subclass, received {received}"
            )
        self.CreateChild("task", p.task)

    def GetTask(self) -> BaseTask:
        """The task."""
        return self.task

    def FProp(self, theta: NestedMap, input_batch: NestedMap) -> NestedMap:
        """The task's metrics of `input_batch`."""
        return self.task.FProp(theta.task, input_batch)
