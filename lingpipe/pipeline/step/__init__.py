"""Running a training step: micro-batches, the executor that creates each action's
ops in the schedule's order, recomputation, stage devices, precision, gradient sums, XLA."""
