"""NVML health on a real GPU: no false alarms on healthy devices, XID events registered where supported."""

from __future__ import annotations

import threading
import time

import pytest

from gpuslice.kube.health import APPLICATION_XIDS, NvmlHealth


def test_application_xids_are_not_device_faults():
    assert {13, 31, 43, 45, 68, 109} == set(APPLICATION_XIDS) and 79 not in APPLICATION_XIDS  # 79: fell off the bus


@pytest.mark.gpu
def test_nvml_health_reports_no_false_alarm_on_healthy_gpus():
    from gpuslice.host.devices import discover_nvml

    devs = discover_nvml()
    reports: list[tuple] = []
    stop = threading.Event()
    t = threading.Thread(target=NvmlHealth(poll_seconds=0.2).run, args=(devs, lambda *a: reports.append(a), stop))
    t.start()
    time.sleep(2.0)  # ~10 polls and two event waits
    stop.set()
    t.join(5)
    assert not t.is_alive() and reports == []


@pytest.mark.gpu
def test_nvml_health_reports_a_device_nvml_cannot_find():
    from dataclasses import replace

    from gpuslice.host.devices import discover_nvml

    real = discover_nvml()[0]
    ghost = replace(real, uuid="GPU-00000000-0000-0000-0000-000000000000", index=99)
    reports: list[tuple] = []
    stop = threading.Event()
    t = threading.Thread(target=NvmlHealth(poll_seconds=0.1).run, args=([real, ghost], lambda *a: reports.append(a), stop))
    t.start()
    deadline = time.monotonic() + 5
    while not reports and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    t.join(5)
    assert reports and all(r[0] == ghost.uuid and r[1] is False for r in reports)
