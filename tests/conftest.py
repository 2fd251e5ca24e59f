"""Every test sees 8 logical CPU devices: they stand in for accelerators.

This must run before TensorFlow initializes its devices, so it happens at import time.
"""

import pytest

from lingpipe import cluster, test_utils

cluster.SetLogicalCpuDevices(8)


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    """Each test gets its own fixed seed, derived from its name."""
    test_utils.SetSeeds(test_utils.SeedFor(request.node.nodeid))
