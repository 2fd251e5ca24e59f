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


def test_pipeline_devices_checks_the_list_or_takes_the_first_stage_devices():
    assert cluster.PipelineDevices(None, 2) == ["/device:CPU:0", "/device:CPU:1"]
    assert cluster.PipelineDevices(("cpu:3", "CPU:1"), 2) == ["/device:CPU:3", "/device:CPU:1"]
    with pytest.raises(ValueError, match="pipe: num_stages=9: StageDevices: asked for 9"):
        cluster.PipelineDevices(None, 9, "pipe")
    with pytest.raises(
        ValueError,
        match=r"pipe: expected one device per stage, received 1 device\(s\) "
        r"\['CPU:0'\] for num_stages=2",
    ):
        cluster.PipelineDevices(["CPU:0"], 2, "pipe")
    with pytest.raises(ValueError, match="pipe: device 'CPU:8' does not exist"):
        cluster.PipelineDevices(["CPU:0", "CPU:8"], 2, "pipe")
    # One name, not read as its characters; a number, with what to pass instead.
    with pytest.raises(ValueError, match=r"pipe: expected devices to be a list of device "
                       r"names, one per stage, .*; received devices='CPU:0'$"):  # fmt: skip
        cluster.PipelineDevices("CPU:0", 2, "pipe")
    with pytest.raises(ValueError, match=r"received devices=2 \(for 2 stages on the first "
                       r"2 devices, num_stages=2\)$"):  # fmt: skip
        cluster.PipelineDevices(2, 2, "pipe")


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


def test_replica_device_groups_split_devices_in_consecutive_groups():
    devices = [f"/device:CPU:{i}" for i in range(8)]
    assert cluster.ReplicaDeviceGroups(4) == [devices[:4], devices[4:]]
    assert cluster.ReplicaDeviceGroups(2, num_replicas=3) == [
        devices[0:2],
        devices[2:4],
        devices[4:6],
    ]
    assert cluster.ReplicaDeviceGroups(3) == [devices[:3], devices[3:6]]  # 2 left idle
    text = cluster.DescribeGroups(cluster.ReplicaDeviceGroups(3), devices)
    assert text.splitlines()[-1] == "idle: /device:CPU:6, /device:CPU:7"
    with pytest.raises(ValueError, match=r"5 replica\(s\) of 2 stage\(s\) need 10 devices"):
        cluster.ReplicaDeviceGroups(2, num_replicas=5)
    with pytest.raises(ValueError, match=r"1 replica\(s\) of 9 stage\(s\) need 9 devices"):
        cluster.ReplicaDeviceGroups(9)
    with pytest.raises(ValueError, match=r"expected num_stages >= 1, received 0"):
        cluster.ReplicaDeviceGroups(0)


def test_replica_devices_scope_the_stage_devices_of_pipelines_built_within():
    from lingpipe.layers import gpipe, linear

    cell = linear.LinearLayer.Params().Set(input_dims=2, output_dims=2)
    p = gpipe.PipeliningLayer.Params().Set(name="pipe", cell_tpl=[cell] * 2, num_stages=2)
    with cluster.ReplicaDevices(["CPU:6", "/cpu:7"]) as group:
        assert group == ["/device:CPU:6", "/device:CPU:7"]
        assert cluster.StageDevices(2) == group
        pipe = p.Instantiate()
        with pytest.raises(ValueError, match=r"this replica's device group has 2"):
            cluster.StageDevices(3)
    assert pipe.devices == ["/device:CPU:6", "/device:CPU:7"]
    assert pipe.cell_1.vars.w.device.endswith("CPU:7")
    assert cluster.StageDevices(2) == ["/device:CPU:0", "/device:CPU:1"]  # restored


def test_the_cpu_allocator_counts_small_tensors_too():
    # oneDNN's default CPU allocator counts only allocations of 256 KiB and up in its
    # statistics: a micro-batch's activations would be missing from a measured peak.
    import gc

    import tensorflow as tf

    gc.collect()  # what earlier tests left is freed before, not during, the reading
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    with tf.device("/device:CPU:1"):
        held = [tf.fill([16 * 1024], float(i)) for i in range(16)]  # 64 KiB each
    grown = tf.config.experimental.get_memory_info("CPU:0")["current"] - before
    assert grown >= 16 * 64 * 1024, grown
    del held
