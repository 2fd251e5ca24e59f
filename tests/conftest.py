"""Every test sees 8 logical CPU devices: they stand in for accelerators.

This must run before TensorFlow initializes its devices, so it happens at import time.

Each test also starts from the same process-wide settings (Keras' dtype policy, floatx,
epsilon and image layout, whether tf.functions run eagerly, lingpipe's eval, recompute
and seed scopes): a test that changes one and leaves it changed fails in its teardown,
naming it, and the setting is put back, so the tests after it on the same worker see
what they would see alone.

Grappler, TensorFlow's graph optimizer, is off in the test processes: optimizing graphs
that a test runs once or twice took a quarter of the suite's time, and what the tests
check (results equal to a reference computed the same way, order and placement read
from the traced graph, errors) does not depend on it. Tests marked `grappler` run with
it on (the traced equivalence grid, the concurrency tests, a real Keras model's fit),
as do the trainer, the examples and the benchmarks, which the tests run as subprocesses.

Under pytest-xdist (the default run: -n 2) the controller runs no test, so it does not
import TensorFlow: its import came before the workers started, about 5 s of every run.
"""

import pytest


def pytest_configure(config):
    """The devices and Grappler's setting (module doc), in each process that runs tests."""
    if config.getoption("dist", "no") != "no" and not hasattr(config, "workerinput"):
        return  # pytest-xdist's controller
    import tensorflow as tf

    from lingpipe import cluster

    cluster.SetLogicalCpuDevices(8)
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})


@pytest.fixture(autouse=True)
def _grappler_where_marked(request):
    """Grappler on for a test marked `grappler` (module doc), off again after it."""
    import tensorflow as tf

    if request.node.get_closest_marker("grappler") is None:
        yield
        return
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": False})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})


def _Settings():
    """{name: (value, how to put it back)} of the process-wide settings a test may change."""
    import keras
    import tensorflow as tf

    from lingpipe import base_layer, seeds

    policy = keras.mixed_precision.global_policy().name
    floatx, epsilon = keras.config.floatx(), keras.config.epsilon()
    layout, eager = keras.config.image_data_format(), tf.config.functions_run_eagerly()
    optimizer = tf.config.optimizer.get_experimental_options()
    return {
        "keras.mixed_precision.global_policy()": (
            policy,
            lambda: keras.mixed_precision.set_global_policy(policy),
        ),
        "keras.config.floatx()": (floatx, lambda: keras.config.set_floatx(floatx)),
        "keras.config.epsilon()": (epsilon, lambda: keras.config.set_epsilon(epsilon)),
        "keras.config.image_data_format()": (
            layout,
            lambda: keras.config.set_image_data_format(layout),
        ),
        "tf.config.functions_run_eagerly()": (
            eager,
            lambda: tf.config.run_functions_eagerly(eager),
        ),
        "tf.config.optimizer.get_experimental_options()": (
            optimizer,
            lambda: tf.config.optimizer.set_experimental_options(optimizer),
        ),
        # Context managers' stacks: a test leaves them as it found them, or a scope leaked.
        "lingpipe.base_layer.DoEval()": (base_layer.DoEval(), None),
        "lingpipe.base_layer.IsRecomputing()": (base_layer.IsRecomputing(), None),
        "lingpipe.seeds.CurrentScopeValues()": (seeds.CurrentScopeValues(), None),
    }


def Leaked(before, after):
    """'name: was A, now B' for each setting of `before` that `after` differs in."""
    return [
        f"{name}: was {value!r}, now {after[name][0]!r}"
        for name, (value, _) in before.items()
        if after[name][0] != value
    ]


@pytest.fixture(autouse=True)
def _same_settings_for_every_test():
    """Fails a test that leaves a process-wide setting changed, and puts it back."""
    before = _Settings()
    yield
    after = _Settings()
    leaked = Leaked(before, after)
    for name, (value, restore) in before.items():
        if restore is not None and after[name][0] != value:
            restore()
    if leaked:
        pytest.fail(
            "the test changed process-wide settings and left them so (later tests on this "
            "worker would run under them): " + "; ".join(leaked),
            pytrace=False,
        )


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    """Each test gets its own fixed seed, derived from its name."""
    from lingpipe import test_utils

    test_utils.SetSeeds(test_utils.SeedFor(request.node.nodeid))
