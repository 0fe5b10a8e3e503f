"""The webhook refuses GPU pods that would step out of their slice (issue 15: pods mounting their own volume at
/etc/ld.so.preload or /etc/gpuslice/ were let through)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kube"))  # kubefixtures.py, as tests/kube/conftest.py does

from kubefixtures import pod  # noqa: E402

from gpuslice.kube import resources, webhook  # noqa: E402
from gpuslice.kube.escapes import escape_problem  # noqa: E402

CFG = resources.KubeConfig(default_gpu_num=1)


def _review(obj):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
                        "object": obj}}


def _gpu_pod(**container):
    p = pod("escape", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2048"})
    p["spec"]["containers"][0].update(container)
    return p


@pytest.mark.parametrize("path", ["/etc/ld.so.preload", "/etc/gpuslice", "/etc/gpuslice/", "/etc/gpuslice/slice",
                                  "//etc/./gpuslice", "/usr/local/gpuslice/lib", "/usr/local/gpuslice/lib/libgpuslice.so",
                                  "/var/run/gpuslice", "/var/run/gpuslice/region", "/run/gpuslice/devices"])
def test_a_mount_over_the_enforcers_paths_is_refused_naming_it(path):
    p = _gpu_pod(volumeMounts=[{"name": "mine", "mountPath": path}])
    answer = webhook.mutate(_review(p), CFG)["response"]
    assert answer["allowed"] is False
    assert "volumeMounts[0].mountPath" in answer["status"]["message"] and path in answer["status"]["message"]


@pytest.mark.parametrize("path", ["/etc", "/etc/gpuslice-data", "/usr/local", "/data", "/var/run", "/run/secrets"])
def test_mounts_beside_or_above_them_are_allowed(path):
    """A mount above them is covered by the device plugin's own mounts, which the runtime mounts on top."""
    assert escape_problem(_gpu_pod(volumeMounts=[{"name": "v", "mountPath": path}])) is None


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_AUDIT", "GPUSLICE_SLICE", "GPUSLICE_GRANT", "GPUSLICE_ANYTHING"])
def test_env_that_escapes_is_refused(name):
    for var in ({"name": name, "value": "/tmp/x"}, {"name": name, "valueFrom": {"fieldRef": {"fieldPath": "x"}}}):
        answer = webhook.mutate(_review(_gpu_pod(env=[{"name": "OK", "value": "1"}, var])), CFG)["response"]
        assert answer["allowed"] is False and f"env[1].name '{name}'" in answer["status"]["message"]


@pytest.mark.parametrize("name", ["GPUSLICE_MEMORY_LIMIT", "GPUSLICE_COMPUTE", "GPUSLICE_FAIL_OPEN",
                                  "GPUSLICE_LOG_LEVEL", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES"])
def test_env_that_only_lowers_or_is_unrelated_is_allowed(name):
    assert escape_problem(_gpu_pod(env=[{"name": name, "value": "1"}])) is None


def test_init_containers_and_block_devices_are_checked_too():
    p = _gpu_pod()
    p["spec"]["initContainers"] = [{"name": "init", "image": "x", "volumeMounts": [{"name": "v", "mountPath": "/etc/gpuslice"}]}]
    assert "initContainers[0]" in escape_problem(p)
    q = _gpu_pod(volumeDevices=[{"name": "b", "devicePath": "/etc/ld.so.preload"}])
    assert "volumeDevices[0].devicePath" in escape_problem(q)


def test_pods_without_gpus_are_not_judged():
    p = pod("plain", {"cpu": "1"})
    p["spec"]["containers"][0]["volumeMounts"] = [{"name": "v", "mountPath": "/etc/gpuslice"}]
    assert webhook.mutate(_review(copy.deepcopy(p)), CFG)["response"]["allowed"] is True


@pytest.mark.parametrize("gpu", [True, False])
@pytest.mark.parametrize("var", [{"value": "all"}, {"value": "GPU-0"}, {"value": "0,1"},
                                 {"valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}])
def test_nvidia_visible_devices_naming_gpus_is_refused_in_any_pod(gpu, var):
    """The kubelet puts the pod's env after the device plugin's, and the NVIDIA toolkit gives the container
    the GPUs it names: with no slice and no enforcer, even in a pod that asks for no GPU."""
    p = _gpu_pod() if gpu else pod("plain", {})
    p["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", **var}]
    answer = webhook.mutate(_review(p), CFG)["response"]
    assert answer["allowed"] is False and "NVIDIA_VISIBLE_DEVICES" in answer["status"]["message"]


@pytest.mark.parametrize("value", ["none", "void", "", "NONE"])
def test_nvidia_visible_devices_asking_for_none_is_allowed(value):
    p = pod("plain", {})
    p["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}]
    assert webhook.mutate(_review(p), CFG)["response"]["allowed"] is True


@pytest.mark.parametrize("prefix", ["LD_", "LD_PRE", "L", "GPUSLICE_", "GPU", "GPUSLICE_X_"])
def test_an_env_from_prefix_that_makes_a_refused_name_is_refused(prefix):
    """``envFrom`` keys are not in the pod, but its ``prefix`` is: ``LD_`` + a ConfigMap key ``PRELOAD`` is
    ``LD_PRELOAD`` (issue 15, attacker's review: let through before)."""
    p = _gpu_pod(envFrom=[{"configMapRef": {"name": "cm"}}, {"prefix": prefix, "secretRef": {"name": "s"}}])
    answer = webhook.mutate(_review(p), CFG)["response"]
    assert answer["allowed"] is False and "envFrom[1].prefix" in answer["status"]["message"]


@pytest.mark.parametrize("prefix", ["", "APP_", "MY_LD_", "CUDA_"])
def test_env_from_without_such_a_prefix_is_allowed(prefix):
    """An empty prefix cannot be judged from the pod (README Limits: the backstop holds memory against it)."""
    source = {"configMapRef": {"name": "cm"}, **({"prefix": prefix} if prefix else {})}
    assert escape_problem(_gpu_pod(envFrom=[source])) is None
