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
                                  "GPUSLICE_LOG_LEVEL", "GPUSLICE_SPATIAL_YIELD", "LD_LIBRARY_PATH",
                                  "CUDA_VISIBLE_DEVICES"])
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


# ---------------------------------------------------------------------------------- ephemeral containers
def _debug_review(obj):
    """What the API server sends for ``kubectl debug``: an UPDATE of pods/ephemeralcontainers, the whole Pod."""
    review = _review(obj)
    review["request"].update(operation="UPDATE", subResource="ephemeralcontainers",
                             resource={"group": "", "version": "v1", "resource": "pods"},
                             oldObject=copy.deepcopy(obj))
    review["request"]["oldObject"]["spec"].pop("ephemeralContainers", None)
    return review


def _debugged(base, **container):
    p = copy.deepcopy(base)
    p["spec"]["ephemeralContainers"] = [{"name": "debugger", "image": "busybox", "targetContainerName": "main",
                                         **container}]
    return p


@pytest.mark.parametrize("container, needle", [
    ({"env": [{"name": "LD_PRELOAD", "value": "/tmp/mine.so"}]}, "env[0].name 'LD_PRELOAD'"),
    ({"env": [{"name": "GPUSLICE_SLICE", "value": "/tmp/slice"}]}, "env[0].name 'GPUSLICE_SLICE'"),
    ({"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}, "NVIDIA_VISIBLE_DEVICES"),
    ({"volumeMounts": [{"name": "mine", "mountPath": "/etc/ld.so.preload"}]}, "volumeMounts[0].mountPath"),
    ({"envFrom": [{"prefix": "LD_", "configMapRef": {"name": "cm"}}]}, "envFrom[0].prefix"),
])
def test_an_ephemeral_container_that_escapes_is_refused_naming_it(container, needle):
    """``kubectl debug`` adds a container to a running GPU pod through the pods/ephemeralcontainers subresource
    (attacker's review of issue 15: neither the checks nor the webhook's rules covered it)."""
    p = _debugged(_gpu_pod(), **container)
    assert escape_problem(p) or needle == "NVIDIA_VISIBLE_DEVICES"
    answer = webhook.mutate(_debug_review(p), CFG)["response"]
    assert answer["allowed"] is False, answer
    message = answer["status"]["message"]
    assert "spec.ephemeralContainers[0] (debugger)" in message and needle in message, message


def test_nvidia_visible_devices_in_an_ephemeral_container_of_any_pod_is_refused():
    p = _debugged(pod("plain", {}), env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    answer = webhook.mutate(_debug_review(p), CFG)["response"]
    assert answer["allowed"] is False and "spec.ephemeralContainers[0] (debugger)" in answer["status"]["message"]


def test_a_plain_debug_container_is_allowed_and_nothing_is_patched():
    for base in (_gpu_pod(), pod("plain", {"cpu": "1"})):
        answer = webhook.mutate(_debug_review(_debugged(base, env=[{"name": "TERM", "value": "xterm"}])), CFG)
        assert answer["response"] == {"uid": "u-1", "allowed": True}
    # in a pod asking for no GPU, LD_PRELOAD is not the webhook's business (as at CREATE)
    plain = _debugged(pod("plain", {"cpu": "1"}), env=[{"name": "LD_PRELOAD", "value": "/x.so"}])
    assert webhook.mutate(_debug_review(plain), CFG)["response"]["allowed"] is True

