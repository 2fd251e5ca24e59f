"""What a pipeline schedule is made of: actions, and the Schedule that lists them per device.

An action is (kind, stage, micro-batch): `F` a forward, `B` a backward (input and
weight gradients together), and, for zero bubble, `I` (the gradient of the
stage's inputs) and `W` (its weights' gradient) apart. A stage is a chunk of the
model; a device runs one or more stages, as the schedule's `stage_devices` says.

These types are the bottom of the schedule modules: `simulate` runs a Schedule,
`schedule` (which exports these names too) reads and writes torch's CSV format, and
`generators` makes schedules by name. This module imports none of them.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

__all__ = [
    "BACKWARD",
    "BACKWARD_INPUT",
    "BACKWARD_WEIGHT",
    "FORWARD",
    "KINDS",
    "Action",
    "Schedule",
    "ScheduleError",
]

FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT = "F", "B", "I", "W"
KINDS = (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT)


class ScheduleError(ValueError):
    """A schedule that cannot run or be read: one line naming the action, or the file and
    the argument that gave it."""


class Action(NamedTuple):
    """One unit of work: `kind` (F, B, I or W) of `stage` on `micro_batch`."""

    kind: str
    stage: int
    micro_batch: int

    def __str__(self) -> str:
        return f"{self.kind} s{self.stage} mb{self.micro_batch}"


@dataclasses.dataclass(frozen=True)
class Schedule:
    """What each device does, in order, and where each stage lives.

    Attributes:
      name: the generator's name ('1f1b', ...) or any label.
      num_devices: K, the devices that run the pipeline.
      num_stages: the model's stages (chunks), K * num_virtual_stages under loop placement.
      num_micro_batches: M.
      device_actions: device_actions[d] is device d's actions, in order.
      stage_devices: stage_devices[s] is the device of stage s; None (the default)
        is the loop placement s % K.
    """

    name: str
    num_devices: int
    num_stages: int
    num_micro_batches: int
    device_actions: tuple[tuple[Action, ...], ...]
    stage_devices: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        loop = [s % self.num_devices for s in range(self.num_stages)]
        placement = tuple(loop if self.stage_devices is None else self.stage_devices)
        if len(placement) != self.num_stages or any(
            isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < self.num_devices
            for d in placement
        ):
            raise ScheduleError(
                f"schedule {self.name!r}: expected stage_devices to give each of the "
                f"{self.num_stages} stages a device in 0..{self.num_devices - 1}, "
                f"received {placement}"
            )
        object.__setattr__(self, "stage_devices", placement)
        object.__setattr__(self, "device_actions", tuple(map(tuple, self.device_actions)))

    @property
    def num_virtual_stages(self) -> int:
        """Stages per device (v); 1 for a one-stage-per-device schedule."""
        return max(len(self.StagesOf(d)) for d in range(self.num_devices))

    def DeviceOf(self, stage: int) -> int:
        """The device that runs `stage`."""
        return self.stage_devices[stage]

    def StagesOf(self, device: int) -> list[int]:
        """The stages `device` runs, in model order."""
        return [s for s, d in enumerate(self.stage_devices) if d == device]

    def ChunkOf(self, stage: int) -> int:
        """The position of `stage` among its device's stages: 0 for the first."""
        return self.StagesOf(self.DeviceOf(stage)).index(stage)

    def Label(self, a: Action) -> str:
        """`a`'s micro-batch for grids and charts: '3', or '3.1' on its device's second stage
        when a device runs several."""
        chunk = f".{self.ChunkOf(a.stage)}" if self.num_virtual_stages > 1 else ""
        return f"{a.micro_batch}{chunk}"

    @property
    def splits_backward(self) -> bool:
        """Whether backwards come as I and W actions (zero bubble) rather than B."""
        return any(a.kind == BACKWARD_INPUT for acts in self.device_actions for a in acts)

    @property
    def has_backward(self) -> bool:
        """False for a forward-only schedule (evaluation, prediction)."""
        return any(a.kind != FORWARD for acts in self.device_actions for a in acts)

    def __str__(self) -> str:
        rows = [f"device {d}: " + ", ".join(map(str, a)) for d, a in enumerate(self.device_actions)]
        head = f"{self.name} (K={self.num_devices}, M={self.num_micro_batches}):"
        return "\n".join([head, *rows])
