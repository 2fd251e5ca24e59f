"""The GPipe engine's pieces, each testable alone: partition, micro_batch, schedule, executor.

`lingpipe.layers.gpipe.PipeliningLayer` puts them together.
"""
