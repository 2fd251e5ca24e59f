"""cluster: logical CPU devices and the devices stages may use."""

import pytest

from lingpipe import cluster


def test_conftest_gave_eight_logical_cpus():
    assert cluster.AvailableDevices() == [f"/device:CPU:{i}" for i in range(8)]
    assert cluster.AvailableDevices("cpu") == cluster.AvailableDevices()
    assert cluster.AvailableDevices("GPU") == []


def test_stage_devices_and_too_many():
    assert cluster.StageDevices(3) == ["/device:CPU:0", "/device:CPU:1", "/device:CPU:2"]
    with pytest.raises(
        ValueError,
        match="asked for 9 devices for pipeline stages but this machine has 8 CPU device",
    ):
        cluster.StageDevices(9)


def test_set_again_is_idempotent_and_changing_after_init_is_clear():
    cluster.SetLogicalCpuDevices(8)
    with pytest.raises(
        RuntimeError,
        match=r"SetLogicalCpuDevices\(4\): TensorFlow has already "
        r"initialized its devices with 8 logical CPU device",
    ):
        cluster.SetLogicalCpuDevices(4)


@pytest.mark.parametrize("n", [0, -1, 65, 2.5, True])
def test_bad_counts(n):
    with pytest.raises(ValueError, match=r"expected an integer in \[1, 64\], received n="):
        cluster.SetLogicalCpuDevices(n)


def test_canonical_device_names():
    assert cluster.CanonicalDevice("/cpu:3") == "/device:CPU:3"
    assert cluster.CanonicalDevice("CPU:7") == "/device:CPU:7"
    full = "/job:localhost/replica:0/task:0/device:CPU:2"
    assert cluster.CanonicalDevice(full) == "/device:CPU:2"
    with pytest.raises(
        ValueError,
        match=r"device '/device:GPU:0' does not exist; this process "
        r"has \['/device:CPU:0'",
    ):
        cluster.CanonicalDevice("/device:GPU:0")
    with pytest.raises(ValueError, match="device 'CPU:8' does not exist"):
        cluster.CanonicalDevice("CPU:8")
    with pytest.raises(ValueError, match="does not exist|is not a TensorFlow device name"):
        cluster.CanonicalDevice("banana")
    with pytest.raises(ValueError, match="expected device_type in"):
        cluster.AvailableDevices("FPGA")
