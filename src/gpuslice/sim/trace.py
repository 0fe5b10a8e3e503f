"""Reading the openb trace (Alibaba cluster-trace-gpu-v2023) into tasks, nodes and placement requests.

Columns (the trace's README): pods ``name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec,
creation_time, deletion_time`` (the last three optional: the ``multigpu*`` variants have no times);
nodes ``sn, cpu_milli, memory_mib, gpu, model``.

How a task becomes a request (as the FGD paper's simulator reads the trace):

* ``num_gpu == 0``: CPU only — it needs CPU and host memory on some node, no device.
* ``num_gpu == 1`` and ``gpu_milli < 1000``: a shared slice of one GPU. The trace has no per-GPU memory
  column, so ``gpu_milli`` is used as both the compute share and the memory share of the device
  (``46%`` of memory and compute for ``gpu_milli=460``), as the paper treats it as one GPU dimension.
* otherwise: ``num_gpu`` whole GPUs, exclusively.
* ``gpu_spec`` ``V100M16|V100M32`` restricts the models.

Device memory per model is not in the trace; sizes below are the public ones, and the undisclosed
G1/G2/G3 are assumptions. Because the trace asks for *shares*, the sizes do not change any result; they
only make slices concrete (bytes) for the placement core.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from gpuslice.placement import DeviceState, NodeState
from gpuslice.spec import GiB, MemoryAmount, MiB, Request, SpecError, parse_models

# GiB of device memory per trace model. P100/T4/V100/A10: vendor data sheets (P100 16 GB HBM2 variant).
# G1/G2/G3 are undisclosed by Alibaba: assumed 16 / 32 / 80 GiB (older, mainstream, newest generation).
GPU_MEMORY_GIB: dict[str, int] = {
    "P100": 16, "T4": 16, "V100M16": 16, "V100M32": 32, "A10": 24, "G1": 16, "G2": 32, "G3": 80,
}


@dataclass(frozen=True)
class Task:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    models: tuple[str, ...] = ()
    creation: int | None = None
    deletion: int | None = None

    @property
    def gpu_demand(self) -> float:
        """GPUs' worth of capacity the task asks for (what "arrived load" counts)."""
        if self.num_gpu == 0:
            return 0.0
        if self.num_gpu == 1 and self.gpu_milli < 1000:
            return self.gpu_milli / 1000
        return float(self.num_gpu)

    @property
    def host_memory(self) -> int:
        return self.memory_mib * MiB

    def request(self) -> Request | None:
        """The placement request, or ``None`` for a CPU-only task."""
        if self.num_gpu == 0:
            return None
        if self.num_gpu == 1 and self.gpu_milli < 1000:
            # Compute rounds up so a slice never reserves less than the trace asked for.
            return Request(memory=MemoryAmount(percent=self.gpu_milli / 10), compute=math.ceil(self.gpu_milli / 10),
                           models=self.models)
        return Request(count=self.num_gpu, exclusive=True, models=self.models)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


def _int(row: dict, column: str, where: str, optional: bool = False) -> int | None:
    raw = (row.get(column) or "").strip()
    if raw == "" and optional:
        return None
    try:
        value = int(float(raw))
    except ValueError:
        raise SpecError(f"{where} {column}", raw, "a whole number at least 0") from None
    if value < 0:
        raise SpecError(f"{where} {column}", raw, "a whole number at least 0")
    return value


def _rows(path: Path, required: tuple[str, ...]) -> tuple[list[dict], list[str]]:
    path = Path(path)
    if not path.is_file():
        raise SpecError("trace", str(path), "an existing CSV file (see ../shared/traces/SOURCES.md)")
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        columns = reader.fieldnames or []
        missing = [c for c in required if c not in columns]
        if missing:
            raise SpecError(f"{path.name} columns", columns, "a header with " + ", ".join(required))
        return list(reader), columns


def load_tasks(path: Path) -> list[Task]:
    """Tasks of a pod list, in file order."""
    rows, columns = _rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"))
    timed = "creation_time" in columns and "deletion_time" in columns
    tasks = []
    for line, row in enumerate(rows, start=2):
        where = f"{Path(path).name}:{line}"
        num_gpu = _int(row, "num_gpu", where)
        gpu_milli = _int(row, "gpu_milli", where)
        assert num_gpu is not None and gpu_milli is not None
        if num_gpu > 64:
            raise SpecError(f"{where} num_gpu", num_gpu, "0 to 64")
        if num_gpu == 1 and not 0 < gpu_milli <= 1000:
            raise SpecError(f"{where} gpu_milli", gpu_milli, "1 to 1000 for a one-GPU task")
        spec = (row.get("gpu_spec") or "").strip()
        tasks.append(Task(
            name=row["name"], cpu_milli=_int(row, "cpu_milli", where) or 0,
            memory_mib=_int(row, "memory_mib", where) or 0, num_gpu=num_gpu, gpu_milli=gpu_milli,
            models=parse_models(spec, f"{where} gpu_spec") if spec and spec.lower() != "nan" else (),
            creation=_int(row, "creation_time", where, optional=True) if timed else None,
            deletion=_int(row, "deletion_time", where, optional=True) if timed else None))
    if not tasks:
        raise SpecError("trace", str(path), "a pod list with at least one task")
    return tasks


def load_nodes(path: Path) -> list[NodeSpec]:
    """Nodes of a node list; models must be in :data:`GPU_MEMORY_GIB`."""
    rows, _ = _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model"))
    nodes = []
    for line, row in enumerate(rows, start=2):
        where = f"{Path(path).name}:{line}"
        gpus = _int(row, "gpu", where) or 0
        model = (row.get("model") or "").strip()
        if gpus and model not in GPU_MEMORY_GIB:
            raise SpecError(f"{where} model", model, "one of " + ", ".join(GPU_MEMORY_GIB))
        nodes.append(NodeSpec(row["sn"], _int(row, "cpu_milli", where) or 0, _int(row, "memory_mib", where) or 0,
                              gpus, model))
    if not nodes:
        raise SpecError("nodes", str(path), "a node list with at least one node")
    return nodes


def build_nodes(specs: list[NodeSpec], *, split_count: int = 10, memory_scaling: float = 1.0) -> list[NodeState]:
    """Placement state of empty nodes: devices with the model's memory, CPU and host memory tracked."""
    nodes = []
    for spec in specs:
        memory = GPU_MEMORY_GIB.get(spec.model, 16) * GiB
        devices = tuple(DeviceState(uuid=f"GPU-{spec.name}-{j}", memory_total=memory, model=spec.model,
                                    split_count=split_count, memory_scaling=memory_scaling)
                        for j in range(spec.gpus))
        nodes.append(NodeState(spec.name, devices, cpu_milli=spec.cpu_milli, host_memory=spec.memory_mib * MiB))
    return nodes
