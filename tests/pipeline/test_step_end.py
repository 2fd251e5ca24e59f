"""The optimizer's updates wait for the whole pipelined step.

TensorFlow orders a variable's update after the ops that read the variable, not after
the ops that use what they read. Keras gathers all gradients in one IdentityN before its
updates, but Grappler's dependency optimizer removes it, so each update waited only for
its own weight's gradient. A later backward's use of its read of that weight could then
run after the update, and on logical CPUs 1 fit in about 20 saw the updated weight there:
stage 0's gradient ~1e-2 off (the intermittent failure of
test_a_registered_custom_layer_trains; never with Grappler's dependency optimization off).
Read from the traced graph: every op that uses a weight's value comes before every update;
and the step's loss and predictions, which under remat come from forwards no gradient
waits for, are made before every update too.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import lingpipe.keras as lpk

DEVICES = ["/device:CPU:1", "/device:CPU:2"]
UPDATES = ("AssignVariableOp", "AssignSubVariableOp", "AssignAddVariableOp")


@keras.saving.register_keras_serializable(package="lingpipe_test_step_end")
class Scale(keras.layers.Layer):
    """y = x * scale: its weight is used twice in its backward (dy * scale, x * dy)."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="scale")

    def call(self, inputs):
        return inputs * self.scale


def _Ancestors(op: tf.Operation) -> set:
    """The ops `op` waits for, as Grappler leaves them: an IdentityN (Keras gathers the
    gradients in one) passes each input to its own output and orders nothing else, since
    the dependency optimizer removes it."""
    seen, todo = set(), [op]

    def Parents(o: tf.Operation) -> list:
        found = list(o.control_inputs)
        for t in o.inputs:
            if t.op.type == "IdentityN":
                found += [t.op.inputs[t.value_index].op, *t.op.control_inputs]
            else:
                found.append(t.op)
        return found

    while todo:
        for parent in Parents(todo.pop()):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


def _TracedStep(model: keras.Model) -> tuple:
    """`model` compiled (SGD, mse) and fitted once on [8, 5] -> [8, 3] ones, then its
    train_step traced: (the graph, its weights' handles, the ops that update them)."""
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    x, y = np.ones((8, 5), np.float32), np.ones((8, 3), np.float32)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # builds the optimizer
    step = tf.function(lambda a, b: model.train_step((a, b)))
    graph = step.get_concrete_function(tf.constant(x), tf.constant(y)).graph
    inner = {id(outer): placeholder for outer, placeholder in graph.captures}
    handles = {inner[id(w.value.handle)].ref() for w in model.trainable_weights}
    ops = graph.get_operations()
    updates = [o for o in ops if o.type in UPDATES and o.inputs[0].ref() in handles]
    return graph, handles, updates


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zbv"])
def test_every_use_of_a_weight_comes_before_every_weight_update(schedule):
    num_stages = 2
    layers = [
        keras.layers.Dense(4, activation="tanh"),
        Scale(),
        keras.layers.Dense(4, activation="tanh"),
        keras.layers.Dense(3),
    ]  # four, so that zbv's 2 x 2 chunks each hold one
    model = lpk.PipelinedSequential(
        layers,
        num_stages=num_stages,
        num_micro_batches=2 * (2 if schedule == "zbv" else 1),
        input_shape=(5,),
        devices=DEVICES,
        schedule=schedule,
    )
    graph, handles, updates = _TracedStep(model)
    ops = graph.get_operations()
    reads = [o for o in ops if o.type == "ReadVariableOp" and o.inputs[0].ref() in handles]
    # Uses that run: what the step's outputs and its stateful ops need (a recomputed
    # forward's last output, say, is traced but pruned).
    ends = [t.op for t in graph.outputs] + list(graph.control_outputs)
    live = set(ends).union(*(_Ancestors(o) for o in ends))
    uses = {c for r in reads for c in r.outputs[0].consumers() if c in live}
    assert reads and uses and len(updates) == len(model.trainable_weights)
    for update in updates:
        early = uses - _Ancestors(update)
        assert not early, (
            f"{update.name} can run before {len(early)} use(s) of a weight: "
            + ", ".join(sorted(o.name for o in early)[:4])
        )


def test_the_step_s_loss_and_predictions_are_made_before_every_weight_update():
    # Under remat a stage's first forward feeds only the step's loss and predictions (its
    # backward replays it), and nothing ordered those before the update: with a loss
    # reduced by 'sum', 4 to 6 fits in 12 reported a loss up to 2% off, made partly from
    # the updated weights (the weights themselves were right).
    keras.utils.set_random_seed(1)
    x = keras.Input((5,))
    h = keras.layers.Dense(4, activation="tanh")(keras.layers.Dense(4, activation="tanh")(x))
    model = lpk.Pipeline(keras.Model(x, keras.layers.Dense(3)(h)), 2, 2, devices=DEVICES)
    graph, _, updates = _TracedStep(model)
    ops = graph.get_operations()
    # The loss's weighted mean over the micro-batches, and the stitched predictions.
    made = [o for o in ops if o.name.startswith("metrics/") and o.type == "DivNoNan"]
    made += [o for o in ops if o.type == "DynamicStitch"]
    assert updates and len(made) >= 2
    for update in updates:
        late = [o.name for o in made if o not in _Ancestors(update)]
        assert not late, f"{update.name} can run before {late}"
