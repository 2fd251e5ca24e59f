"""Keras 3 models as lingpipe pipelines.

    import lingpipe.keras
    model = lingpipe.keras.Pipeline(keras_model, num_stages=4, num_micro_batches=8)
    model = lingpipe.keras.PipelinedSequential([...layers...], num_stages=2, ...)

`Pipeline` (lingpipe.keras.functional) pipelines any built Keras 3 model, a
Functional graph or a keras.Sequential, with the model's own weights;
`PipelinedSequential` (lingpipe.keras.sequential) pipelines fresh Keras layers run
in order.
`Plan` (lingpipe.keras.plan) chooses a Pipeline's stages, micro-batches, schedule,
recompute and partition for N devices under a memory cap:

    plan = lingpipe.keras.Plan(keras_model, devices=2, memory_per_device="1GiB",
                               batch_size=64)
    model = lingpipe.keras.Pipeline(keras_model, plan=plan)
"""

from lingpipe.keras.functional import Pipeline
from lingpipe.keras.plan import KerasPlan, Plan
from lingpipe.keras.sequential import PipelinedSequential

__all__ = ["KerasPlan", "Pipeline", "PipelinedSequential", "Plan"]
