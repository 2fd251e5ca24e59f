"""Keras 3 models as lingpipe pipelines.

    import lingpipe.keras
    model = lingpipe.keras.PipelinedSequential([...layers...], num_stages=2, ...)

`PipelinedSequential` (lingpipe.keras.sequential) pipelines fresh Keras layers run
in order.
"""

from lingpipe.keras.sequential import PipelinedSequential

__all__ = ["PipelinedSequential"]
