"""Pipeline schedules as data: the actions, torch's CSV format, the schedules by
name, the simulation, and `python -m lingpipe.pipeline.schedules`."""
