"""The GPipe engine's pieces, each testable alone: partition, micro_batch, stage_call, schedule.

`lingpipe.layers.gpipe.PipeliningLayer` puts them together.
"""
