"""Small openb-format traces written on the fly, so sim tests run in seconds."""

from __future__ import annotations

from pathlib import Path

import pytest

POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"


def write_nodes(path: Path, rows: list[tuple]) -> Path:
    path.write_text("\n".join([NODE_HEADER] + [",".join(map(str, r)) for r in rows]) + "\n")
    return path


def write_pods(path: Path, rows: list[tuple]) -> Path:
    """rows: (cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, creation, deletion)."""
    lines = [POD_HEADER]
    for i, (cpu, mem, num, milli, spec, created, deleted) in enumerate(rows):
        lines.append(f"pod-{i:04d},{cpu},{mem},{num},{milli},{spec},LS,Running,{created},{deleted},{created}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def small_trace(tmp_path: Path) -> tuple[Path, Path]:
    """4 nodes (2×T4, 2×V100M32 with 4 GPUs) and a mixed task list with times."""
    nodes = write_nodes(tmp_path / "nodes.csv", [
        ("n0", 32000, 131072, 2, "T4"), ("n1", 32000, 131072, 2, "T4"),
        ("n2", 64000, 262144, 4, "V100M32"), ("n3", 64000, 262144, 4, "V100M32")])
    shapes = [(4000, 8192, 1, 500, ""), (8000, 16384, 1, 1000, ""), (2000, 4096, 1, 250, ""),
              (16000, 32768, 2, 1000, ""), (4000, 4096, 0, 0, ""), (6000, 8192, 1, 750, "V100M32")]
    rows = []
    for i in range(60):
        cpu, mem, num, milli, spec = shapes[i % len(shapes)]
        rows.append((cpu, mem, num, milli, spec, i * 100, i * 100 + 2500))
    pods = write_pods(tmp_path / "pods.csv", rows)
    return pods, nodes
