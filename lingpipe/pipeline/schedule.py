"""Pipeline schedules as data: for each device, the ordered list of its actions.

An action is (kind, stage, micro-batch): `F` a forward, `B` a backward (input and
weight gradients together), and, for zero bubble, `I` (the gradient of the
stage's inputs) and `W` (its weights' gradient) apart. Stage s lives on device
s mod K; with `num_virtual_stages` v > 1 each device holds v stages (chunks) of
the model, device d stages d, d + K, ..., d + (v-1) K.

    sched = schedule.Make('1f1b', num_stages=4, num_micro_batches=8)
    sched.device_actions[0]   # (F s0 mb0, F s0 mb1, F s0 mb2, F s0 mb3, B s0 mb0, ...)
    sim = simulate.Simulate(sched)   # makespan, bubble per device, peak alive per stage

`PipeliningLayer.ForwardBackward` follows such a list: each device's actions run
in this order and nothing else is ordered but the data. `Make` validates every
schedule by simulating it (lingpipe.pipeline.simulate), so a schedule that breaks
a dependency or would deadlock never reaches the executor.

    python -m lingpipe.pipeline.schedule --schedule=1f1b --num_stages=4 --num_micro_batches=8

prints the grid (a row per device, a column per time slot) and the figures;
`--png=FILE` also draws the plan as a Gantt chart (lingpipe.pipeline.plot).
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import NamedTuple

FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT = "F", "B", "I", "W"
KINDS = (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT)
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble")


class ScheduleError(ValueError):
    """A schedule that cannot run: the message names the action and shows the grid."""


class Action(NamedTuple):
    """One unit of work: `kind` (F, B, I or W) of `stage` on `micro_batch`."""

    kind: str
    stage: int
    micro_batch: int

    def __str__(self) -> str:
        return f"{self.kind} s{self.stage} mb{self.micro_batch}"


@dataclasses.dataclass(frozen=True)
class Schedule:
    """What each device does, in order.

    Attributes:
      name: the generator's name ('1f1b', ...) or any label.
      num_devices: K, the devices (physical pipeline stages).
      num_stages: the model's stages, K * num_virtual_stages; stage s is on device s % K.
      num_micro_batches: M.
      device_actions: device_actions[d] is device d's actions, in order.
    """

    name: str
    num_devices: int
    num_stages: int
    num_micro_batches: int
    device_actions: tuple[tuple[Action, ...], ...]

    @property
    def num_virtual_stages(self) -> int:
        return self.num_stages // self.num_devices

    def DeviceOf(self, stage: int) -> int:
        return stage % self.num_devices

    def StagesOf(self, device: int) -> list[int]:
        return list(range(device, self.num_stages, self.num_devices))

    @property
    def splits_backward(self) -> bool:
        """Whether backwards come as I and W actions (zero bubble) rather than B."""
        return any(a.kind == BACKWARD_INPUT for acts in self.device_actions for a in acts)

    def __str__(self) -> str:
        rows = [f"device {d}: " + ", ".join(map(str, a)) for d, a in enumerate(self.device_actions)]
        return f"{self.name} (K={self.num_devices}, M={self.num_micro_batches}):\n" + "\n".join(
            rows
        )


def _Check(name: str, value: int, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ScheduleError(f"schedule: expected {name} >= {minimum}, received {name}={value!r}")


def GPipe(num_stages: int, num_micro_batches: int) -> Schedule:
    """Fill-drain: each device runs every forward, then every backward, last micro-batch first."""
    k_total, m_total = num_stages, num_micro_batches
    devices = []
    for k in range(k_total):
        acts = [Action(FORWARD, k, m) for m in range(m_total)]
        acts += [Action(BACKWARD, k, m) for m in reversed(range(m_total))]
        devices.append(tuple(acts))
    return Schedule("gpipe", k_total, k_total, m_total, tuple(devices))


def _OneFOneBOrder(warmup: int, total: int) -> list[tuple[str, int]]:
    """`warmup` forwards, then one forward and one backward at a time, then the backwards."""
    order = [(FORWARD, i) for i in range(warmup)]
    for i in range(total - warmup):
        order += [(FORWARD, warmup + i), (BACKWARD, i)]
    order += [(BACKWARD, i) for i in range(total - warmup, total)]
    return order


def OneFOneB(num_stages: int, num_micro_batches: int) -> Schedule:
    """1F1B (PipeDream-flush): device k warms up with K-k-1 forwards, then alternates.

    Stage k never holds the activations of more than K-k micro-batches, where
    GPipe holds M; the bubble is GPipe's.
    """
    k_total, m_total = num_stages, num_micro_batches
    devices = []
    for k in range(k_total):
        order = _OneFOneBOrder(min(k_total - k - 1, m_total), m_total)
        devices.append(tuple(Action(kind, k, m) for kind, m in order))
    return Schedule("1f1b", k_total, k_total, m_total, tuple(devices))


def Interleaved1F1B(num_devices: int, num_micro_batches: int, num_virtual_stages: int) -> Schedule:
    """Megatron's interleaved 1F1B: device d holds stages d, d+K, ..., d+(v-1)K.

    Micro-batches go through a device's stages in groups of K: forward i of a device
    is micro-batch (i // (K v)) K + i % K of its chunk (i // K) % v (the backwards
    take the chunks in reverse). The warm-up is 2 (K-d-1) + (v-1) K forwards.
    Shrinks the bubble v times at the cost of v times more boundary traffic.
    """
    k_total, m_total, v = num_devices, num_micro_batches, num_virtual_stages
    if v > 1 and m_total % k_total:
        raise ScheduleError(
            f"schedule 'interleaved_1f1b': num_micro_batches={m_total} must be a multiple of "
            f"num_stages={k_total} (micro-batches go through each device's chunks in groups "
            f"of {k_total}); received num_micro_batches={m_total}"
        )
    total = m_total * v

    def ChunkAndMicroBatch(i: int, forward: bool) -> tuple[int, int]:
        chunk = (i // k_total) % v
        return (chunk if forward else v - 1 - chunk), (i // (k_total * v)) * k_total + i % k_total

    devices = []
    for d in range(k_total):
        warmup = (k_total - d - 1) * 2 + (v - 1) * k_total if v > 1 else k_total - d - 1
        acts = []
        for kind, i in _OneFOneBOrder(min(warmup, total), total):
            chunk, m = ChunkAndMicroBatch(i, kind == FORWARD)
            acts.append(Action(kind, chunk * k_total + d, m))
        devices.append(tuple(acts))
    return Schedule("interleaved_1f1b", k_total, k_total * v, m_total, tuple(devices))


def ZeroBubbleH1(num_stages: int, num_micro_batches: int) -> Schedule:
    """ZB-H1 (Qi et al., 2024): 1F1B with each backward split into I and W, the W's
    deferred into the bubbles.

    Built by list scheduling in unit time slots: a device runs its next I when it
    can (the critical path), else its next F if it holds fewer than K-k micro-batches
    whose W is not done (1F1B's peak), else its oldest pending W, else waits.
    """
    k_total, m_total = num_stages, num_micro_batches
    done: set[tuple[str, int, int]] = set()
    acts: list[list[Action]] = [[] for _ in range(k_total)]
    next_f, next_i = [0] * k_total, [0] * k_total
    pending_w: list[list[int]] = [[] for _ in range(k_total)]
    while any(len(a) < 3 * m_total for a in acts):
        slot = []
        for k in range(k_total):
            f, i = next_f[k], next_i[k]
            alive = f - (i - len(pending_w[k]))
            i_ready = (
                i < f
                and (FORWARD, k, i) in done
                and (k == k_total - 1 or (BACKWARD_INPUT, k + 1, i) in done)
            )
            f_ready = f < m_total and (k == 0 or (FORWARD, k - 1, f) in done)
            if i_ready:
                action, next_i[k] = Action(BACKWARD_INPUT, k, i), i + 1
                pending_w[k].append(i)
            elif f_ready and alive < k_total - k:
                action, next_f[k] = Action(FORWARD, k, f), f + 1
            elif pending_w[k]:
                action = Action(BACKWARD_WEIGHT, k, pending_w[k].pop(0))
            else:
                continue
            acts[k].append(action)
            slot.append(action)
        if not slot:  # cannot happen for K, M >= 1; a bug here must not hang the caller
            raise ScheduleError(f"schedule 'zero_bubble': no device can move at {acts}")
        done.update(slot)  # unit time: what ran in this slot is done for the next
    return Schedule("zero_bubble", k_total, k_total, m_total, tuple(tuple(a) for a in acts))


def Make(
    name: str, num_stages: int, num_micro_batches: int, num_virtual_stages: int = 1
) -> Schedule:
    """The schedule `name` for K = num_stages devices and M micro-batches, validated.

    Raises:
      ScheduleError: unknown name (with a suggestion), bad counts, or an M the
        schedule cannot run.
    """
    if name not in SCHEDULES:
        close = difflib.get_close_matches(str(name), SCHEDULES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ScheduleError(
            f"schedule: unknown schedule {name!r}, expected one of {', '.join(SCHEDULES)}{hint}"
        )
    _Check("num_stages", num_stages)
    _Check("num_micro_batches", num_micro_batches)
    _Check("num_virtual_stages", num_virtual_stages)
    if num_virtual_stages > 1 and name != "interleaved_1f1b":
        raise ScheduleError(
            f"schedule {name!r}: num_virtual_stages={num_virtual_stages} needs "
            f"schedule='interleaved_1f1b'; the others run one stage per device"
        )
    if name == "gpipe":
        sched = GPipe(num_stages, num_micro_batches)
    elif name == "1f1b":
        sched = OneFOneB(num_stages, num_micro_batches)
    elif name == "interleaved_1f1b":
        sched = Interleaved1F1B(num_stages, num_micro_batches, num_virtual_stages)
    else:
        sched = ZeroBubbleH1(num_stages, num_micro_batches)
    from lingpipe.pipeline import simulate

    simulate.Simulate(sched)  # raises ScheduleError if it cannot run
    return sched


def ForwardTicks(num_stages: int, num_micro_batches: int) -> list[list[tuple[int, int]]]:
    """Fill-drain forward clock ticks: ticks[t] lists the (stage, micro_batch) pairs of t."""
    ticks = []
    for t in range(num_stages + num_micro_batches - 1):
        ticks.append([(k, t - k) for k in range(num_stages) if 0 <= t - k < num_micro_batches])
    return ticks


def BubbleFraction(num_stages: int, num_micro_batches: int) -> float:
    """Idle share of the fill-drain pipeline, (K - 1) / (M + K - 1), as in the GPipe paper."""
    return (num_stages - 1) / (num_micro_batches + num_stages - 1)


def main(argv: list[str] | None = None) -> int:
    """`python -m lingpipe.pipeline.schedule`: prints a schedule's grid and figures."""
    import argparse

    from lingpipe.pipeline import simulate

    parser = argparse.ArgumentParser(prog="python -m lingpipe.pipeline.schedule")
    parser.add_argument("--schedule", default="gpipe", help=f"one of {', '.join(SCHEDULES)}")
    parser.add_argument("--num_stages", type=int, default=4, help="K, the devices")
    parser.add_argument("--num_micro_batches", type=int, default=8, help="M")
    parser.add_argument("--num_virtual_stages", type=int, default=1, help="v (interleaved)")
    parser.add_argument("--list", action="store_true", help="also print each device's list")
    parser.add_argument("--png", default="", help="also draw the plan to this PNG file")
    args = parser.parse_args(argv)
    try:
        sched = Make(
            args.schedule, args.num_stages, args.num_micro_batches, args.num_virtual_stages
        )
    except ScheduleError as e:
        print(f"lingpipe.pipeline.schedule: error: {e}")
        return 2
    sim = simulate.Simulate(sched)
    print(simulate.Grid(sched, sim))
    print()
    print(simulate.Figures(sched, sim))
    if args.list:
        print()
        print(sched)
    if args.png:
        from lingpipe.pipeline import plot

        print(f"\nwrote {plot.PlotSimulation(sched, sim, args.png)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
