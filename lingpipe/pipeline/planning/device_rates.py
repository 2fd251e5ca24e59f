"""What this machine's devices do per second, measured in a few seconds: what
lingpipe.pipeline.planning.planner.MeasureRates gathers into its `Rates`.

    flops_per_s = device_rates.MeasureFlopsPerSecond("/device:CPU:0")
    bytes_per_s, latency_s = device_rates.MeasureTransfer("/device:CPU:0", "/device:CPU:1")

Every reading is of work as it runs inside a step's function, less the function's own
call where that matters: the fixed cost of an action on lingpipe's executor
(MeasureActionSeconds); a tensor crossing to another device and back
(MeasureTransfer); adding a gradient to a sum and the optimizer's apply, per byte and
per weight (MeasureAddSecondsPerByte, MeasureApplySecondsPerByte, MeasureWeightSeconds);
and how much slower a device computes while the others compute (MeasureContention).
Each is the least of a few readings (`Best`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from lingpipe.pipeline.schedules import simulate
from lingpipe.pipeline.schedules.schedule import BACKWARD, FORWARD

__all__ = [
    "Best",
    "MeasureActionSeconds",
    "MeasureAddSecondsPerByte",
    "MeasureApplySecondsPerByte",
    "MeasureContention",
    "MeasureFlopsPerSecond",
    "MeasureTransfer",
    "MeasureWeightSeconds",
]


def Best(fn: Callable[[], Any], repeats: int = 5) -> float:
    """The least seconds of `repeats` calls of `fn` after one to trace and warm it up (on
    a shared machine interference only adds time)."""
    fn()  # trace and warm up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def MeasureActionSeconds(devices: Sequence[str], repeats: int = 7) -> float:
    """The fixed cost of one action, measured on lingpipe's executor (cost_model's module
    doc): a 1F1B pipeline of one tiny matmul per stage over `devices` (1 or 2 of them),
    at 2 and 10 micro-batches of one example."""
    import tensorflow as tf

    from lingpipe.nested_map import NestedMap
    from lingpipe.pipeline.schedules import generators
    from lingpipe.pipeline.step import executor, stage_context

    devices = list(devices)[:2]
    k = len(devices)
    weights = []
    for d in devices:
        with tf.device(d):
            weights.append(tf.Variable(tf.eye(4)))
    stages = [executor.Stage([w], lambda ws, x: tf.matmul(x, ws[0])) for w in weights]

    def Loss(outputs: Any, _: Any) -> NestedMap:
        return NestedMap(loss=(tf.reduce_sum(outputs), 1.0))

    def StepSeconds(m: int) -> tuple[float, float]:
        sched = generators.Make("1f1b" if k > 1 else "gpipe", k, m)
        x = [tf.ones([1, 4]) for _ in range(m)]

        @tf.function(autograph=False)
        def Step() -> Any:
            r = executor.Run(
                sched, stages, x, Loss, [None] * m, keep=set(),
                context=lambda s, mb: stage_context.StageContext(devices[sched.DeviceOf(s)]),
            )  # fmt: skip
            return r.metrics.loss[0], r.weight_grads

        seconds = Best(lambda: tf.nest.map_structure(lambda t: t.numpy(), Step()), repeats)
        units = simulate.Simulate(sched, {FORWARD: 1.0, BACKWARD: 1.0}).makespan
        return seconds, units

    (t2, u2), (t10, u10) = StepSeconds(2), StepSeconds(10)
    return max(0.0, (t10 - t2) / (u10 - u2))


def MeasureAddSecondsPerByte(device: str, repeats: int = 5) -> float:
    """Seconds per weight byte of adding a micro-batch's gradient to a running sum (what
    the executor does per micro-batch and weight), on a 1M-element weight, less the
    call of a function that does nothing."""
    import tensorflow as tf

    with tf.device(device):
        a = tf.random.stateless_normal([1024, 1024], [1, 2])
        b = tf.random.stateless_normal([1024, 1024], [3, 4])
        small = tf.zeros([1])

    add = tf.function(lambda: (a + b)[0, 0], autograph=False)
    empty = tf.function(lambda: small + 1.0, autograph=False)
    seconds = Best(lambda: add().numpy(), repeats) - Best(lambda: empty().numpy(), repeats)
    return max(seconds, 0.0) / (4 * 1024 * 1024)


def MeasureWeightSeconds(device: str, repeats: int = 5, weights: int = 64) -> tuple[float, float]:
    """(apply, add): seconds per weight (per variable), beside its bytes, of lingpipe's
    Adam apply and of adding a gradient to a running sum. Each weight runs ops of its
    own, and each op has a cost of its own that its bytes do not say: the tiny LM's 37
    weights (0.5 MiB) took 1.1 ms to apply where their bytes at the per-byte rate came
    to 0.24 ms. Timed on `weights` weights of 16 floats less on one, over weights - 1
    (the call and the bytes cancel)."""
    import tensorflow as tf

    from lingpipe import optimizers

    with tf.device(device):
        variables = [tf.Variable(tf.zeros([16])) for _ in range(weights)]
        grads = [tf.ones([16]) + float(i) for i in range(weights)]
    opt = optimizers.Adam.Params().Instantiate()
    opt.Build(variables)

    def Applied(n: int) -> Callable[[], Any]:
        @tf.function(autograph=False)
        def Fn() -> Any:
            return opt.Apply(grads[:n], variables[:n], learning_rate=1e-3)

        return lambda: Fn().numpy()

    def Summed(n: int) -> Callable[[], Any]:
        @tf.function(autograph=False)
        def Fn() -> Any:
            with tf.device(device):
                sums = [g + h for g, h in zip(grads[:n], grads[1 : n + 1] + grads[:1])]
                return tf.add_n(sums)[0]

        return lambda: Fn().numpy()

    def PerWeight(fn: Callable[[int], Callable[[], Any]]) -> float:
        many, one = Best(fn(weights), repeats), Best(fn(1), repeats)
        return max(many - one, 0.0) / (weights - 1)

    return PerWeight(Applied), PerWeight(Summed)


def MeasureContention(
    devices: Sequence[str], repeats: int = 5, rounds: int = 5, pause_s: float = 0.2
) -> float:
    """How much slower one device computes while every one of `devices` computes too:
    a chain of four 512 x 512 matmuls on all of them at once (one tf.function), over
    the same on the first alone; at least 1. Logical devices that share a host's cores
    give up to their number; devices with their own (GPUs) about 1. The least of
    `rounds` readings `pause_s` apart: a shared VM's cores are at times slowed for a
    while (a reading of 1.9 where the steps then ran at 1.0 was seen), which only
    raises a reading."""
    import tensorflow as tf

    devices = list(dict.fromkeys(devices))
    if len(devices) < 2:
        return 1.0
    starts = []
    for i, d in enumerate(devices):
        with tf.device(d):
            starts.append(tf.random.stateless_normal([512, 512], [i, 7]) / 512.0)

    def Chain(d: str, x: Any) -> Any:
        with tf.device(d):
            for _ in range(4):
                x = tf.matmul(x, x)
            return x[0, 0]

    one = tf.function(lambda: Chain(devices[0], starts[0]), autograph=False)
    every = tf.function(
        lambda: tf.add_n([Chain(d, x) for d, x in zip(devices, starts)]), autograph=False
    )
    readings = []
    for r in range(rounds):
        if r:
            time.sleep(pause_s)
        alone = Best(lambda: one().numpy(), repeats)
        together = Best(lambda: every().numpy(), repeats)
        readings.append(together / max(alone, 1e-9))
    return min(max(min(readings), 1.0), float(len(devices)))


def MeasureApplySecondsPerByte(device: str, repeats: int = 5) -> float:
    """Seconds per weight byte of lingpipe's Adam apply (slots built first), on a
    1M-element weight."""
    import tensorflow as tf

    from lingpipe import optimizers

    with tf.device(device):
        var = tf.Variable(tf.zeros([1024, 1024]))
        grad = tf.ones([1024, 1024])
    opt = optimizers.Adam.Params().Instantiate()
    opt.Build([var])

    @tf.function(autograph=False)
    def Apply() -> Any:
        opt.Apply([grad], [var], learning_rate=1e-3)
        return var.read_value()[0, 0]

    return Best(lambda: Apply().numpy(), repeats) / (4 * 1024 * 1024)


def MeasureFlopsPerSecond(device: str, repeats: int = 5) -> float:
    """FLOPs per second of a 512 x 512 matmul on `device`."""
    import tensorflow as tf

    with tf.device(device):
        a = tf.random.stateless_normal([512, 512], [1, 2])
    matmul = tf.function(lambda: tf.matmul(a, a), autograph=False)
    return 2 * 512**3 / Best(lambda: matmul().numpy(), repeats)


# The sizes MeasureTransfer moves: one float (the latency) and 4 MiB (the bandwidth).
_TINY, _LARGE = 1, 1 << 20


def MeasureTransfer(here: str, there: str, hops: int = 32, repeats: int = 7) -> tuple[float, float]:
    """(bytes per second, latency in seconds) of a tensor crossing from one device to
    the other inside a step's function, as a pipeline's stage hands its outputs on.

    A chain of `hops` multiplications, each waiting for the last, runs in one function
    twice: every other one on `there` (each hop a crossing), and all on `here`. Their
    difference over `hops` is one crossing, without the multiplications and without
    the function's call (which, about 0.2 ms on this machine, is not paid per
    crossing: a step's crossings are ops inside one call, a few microseconds each
    between logical CPU devices). At one float it is the latency; at 4 MiB, less the
    latency, it gives the bandwidth. Logical CPU devices hand tensors over without a
    copy, so their 4 MiB crossing can take no longer than one float's: the bandwidth
    is then 4 MiB over a microsecond, the least this reading resolves. With one device
    (here == there) nothing crosses: (that, 0)."""
    import tensorflow as tf

    def Hop(n: int, cross: bool) -> float:
        with tf.device(here):
            x, w = tf.ones([n]), tf.ones([n])
        chain = _Chain(here, there, hops, cross)
        return Best(lambda: chain(x, w).numpy(), repeats)

    large_bytes = 4 * _LARGE
    if here == there:
        return large_bytes / 1e-6, 0.0
    latency = max(Hop(_TINY, True) - Hop(_TINY, False), 0.0) / hops
    large = max(Hop(_LARGE, True) - Hop(_LARGE, False), 0.0) / hops
    return large_bytes / max(large - latency, 1e-6), latency


def _Chain(here: str, there: str, hops: int, cross: bool) -> Any:
    """A function of (x, w): x times w `hops` times, each waiting for the last, every
    other one on `there` where `cross` (each hop then a crossing), else all on `here`."""
    import tensorflow as tf

    @tf.function(autograph=False)
    def Chain(x: Any, w: Any) -> Any:
        for i in range(hops):
            with tf.device(there if cross and i % 2 == 0 else here):
                x = x * w
        return x[:1]

    return Chain
