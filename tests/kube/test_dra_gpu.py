"""On a real GPU (skipped elsewhere; GPUSLICE_REQUIRE_GPU=1 makes it fail): the DRA driver's view of the GPUs
NVML reports, and a claim it prepares enforced on the GPU.

* the ResourceSlice describes every GPU as NVML does (memory capacity, compute capability, NUMA node, island);
* a claim allocated 4 GiB + 30 % of GPU 0 is prepared (slice file + CDI spec); a PyTorch process given what the
  CDI spec gives a container — its env, and the slice file with its container paths mapped to the host paths the
  spec mounts there (no container runtime here) — sees a 4 GiB GPU and is refused past it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fakedra import allocated_claim
from gpuslice.enforcer.library import find_enforcer
from gpuslice.enforcer.slicefile import read_slice_file, write_slice_file
from gpuslice.host.devices import discover
from gpuslice.kube.dra.driver import ClaimRef
from gpuslice.kube.dra.resourceslice import MiB, Sharing, device_name, resource_slice_spec
from test_dra import make_driver

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
GiB = 1024**3


def test_the_slice_describes_the_gpus_nvml_reports() -> None:
    devices = discover()
    spec = resource_slice_spec("gpu-node", devices, Sharing())
    placeable = [d for d in devices if not d.mig_enabled]
    for dev, entry in zip(placeable, spec["devices"]):
        assert entry["name"] == device_name(dev.uuid) and entry["attributes"]["uuid"]["string"] == dev.uuid
        assert entry["capacity"]["memory"]["value"] == str(dev.memory_total // MiB * MiB)
        assert re.fullmatch(r"\d+\.\d+\.0", entry["attributes"]["computeCapability"]["version"]), entry
        if dev.numa_node is not None:
            assert entry["attributes"]["numaNode"] == {"int": dev.numa_node}


def test_a_prepared_claim_is_enforced_on_the_gpu(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    devices = discover()
    gpu = next(d for d in devices if not d.mig_enabled)
    api, driver = make_driver(tmp_path, devices=devices)
    api.add_claim(allocated_claim("gpu-claim", "slice", "n1", [{"device": device_name(gpu.uuid), "memory": 4 * GiB,
                                                                "compute": 30}]))
    assert driver.prepare([ClaimRef("ml", "gpu-claim", "slice")])["gpu-claim"].error == ""
    spec = json.loads((tmp_path / "cdi" / "gpuslice.io-claim_gpu-claim.json").read_text())
    edits = spec["containerEdits"]
    mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    for d in spec["devices"]:
        mounts.update({m["containerPath"]: m["hostPath"] for m in d["containerEdits"].get("mounts", [])})
    # The host paths in the spec are --host-state-dir's; here the agent's own view (--state-dir) holds the files.
    host = {c: h.replace(str(tmp_path / "host-state"), str(tmp_path / "state")) for c, h in mounts.items()}
    sf = read_slice_file(host["/etc/gpuslice/slice"])
    assert (sf.devices, sf.memory_limit, sf.compute) == ((gpu.uuid,), 4 * GiB, 30)
    mapped = tmp_path / "slice-as-mounted"
    region_dir = host["/var/run/gpuslice/region"]
    write_slice_file(mapped, devices=sf.devices, memory_limit=sf.memory_limit, compute=sf.compute, grant=sf.grant,
                     region=sf.region.replace("/var/run/gpuslice/region", region_dir),
                     device_state_dir=host["/var/run/gpuslice/devices"])
    env = dict(os.environ)
    env.update(e.split("=", 1) for e in edits["env"])
    env.update(GPUSLICE_SLICE=str(mapped), LD_PRELOAD=str(find_enforcer()), CUDA_VISIBLE_DEVICES=gpu.uuid)
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "mem_probe.py"), "torch", str(report)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rep = json.loads(report.read_text())
    assert rep["query_before"]["total"] == 4 * GiB and rep["oom"], rep
