"""Reading openb CSVs: how tasks become requests, and refusals that name the file, line and column."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.sim.trace import GPU_MEMORY_GIB, build_nodes, load_nodes, load_tasks
from gpuslice.spec import GiB, SpecError

from .conftest import write_nodes, write_pods

DATA = Path(__file__).resolve().parents[2] / "bench" / "data"


def test_bundled_openb_copy_loads_with_the_published_sizes():
    """8,152 tasks (1,088 CPU-only), 1,213 GPU nodes with 6,212 GPUs — the numbers of the paper's trace."""
    tasks = load_tasks(DATA / "openb_pod_list_default.csv")
    nodes = load_nodes(DATA / "openb_node_list_gpu_node.csv")
    assert len(tasks) == 8152 and sum(t.num_gpu == 0 for t in tasks) == 1088
    assert len(nodes) == 1213 and sum(n.gpus for n in nodes) == 6212
    assert {n.model for n in nodes} <= set(GPU_MEMORY_GIB)
    multi = load_tasks(DATA / "openb_pod_list_multigpu20.csv")  # no time columns in this variant
    assert multi[0].creation is None


def test_task_to_request_mapping(tmp_path):
    """gpu_milli is both memory and compute share; 1000 milli or >1 GPU means whole GPUs; gpu_spec → models."""
    pods = write_pods(tmp_path / "p.csv", [(1000, 100, 1, 460, "", 0, 5), (1000, 100, 1, 1000, "", 0, 5),
                                            (1000, 100, 8, 1000, "", 0, 5), (1000, 100, 0, 0, "", 0, 5),
                                            (1000, 100, 1, 125, "V100M16|V100M32", 0, 5)])
    shared, whole, eight, cpu_only, constrained = load_tasks(pods)
    r = shared.request()
    assert r.memory.percent == 46.0 and r.compute == 46 and not r.exclusive and shared.gpu_demand == 0.46
    assert whole.request().exclusive and whole.request().count == 1 and whole.gpu_demand == 1.0
    assert eight.request().count == 8 and eight.gpu_demand == 8.0
    assert cpu_only.request() is None and cpu_only.gpu_demand == 0.0
    c = constrained.request()
    assert c.models == ("V100M16", "V100M32") and c.compute == 13  # rounds up: never reserve less
    assert constrained.host_memory == 100 * 1024**2


def test_nodes_get_model_memory_and_track_cpu(tmp_path):
    nodes = build_nodes(load_nodes(write_nodes(tmp_path / "n.csv", [("a", 8000, 1024, 2, "V100M32")])),
                        split_count=4)
    (node,) = nodes
    assert node.cpu_milli == 8000 and node.host_memory == GiB
    assert [d.memory_total for d in node.devices] == [32 * GiB] * 2 and node.devices[0].split_count == 4


@pytest.mark.parametrize("row, field", [
    ((1000, 100, "x", 460, "", 0, 5), "num_gpu"),
    ((1000, 100, 1, 0, "", 0, 5), "gpu_milli"),
    ((-5, 100, 1, 100, "", 0, 5), "cpu_milli"),
])
def test_bad_pod_rows_name_file_line_and_column(tmp_path, row, field):
    pods = write_pods(tmp_path / "bad.csv", [(1000, 100, 1, 100, "", 0, 5), row])
    with pytest.raises(SpecError) as exc:
        load_tasks(pods)
    assert exc.value.field == f"bad.csv:3 {field}"


def test_missing_columns_unknown_model_and_missing_file_are_refused(tmp_path):
    (tmp_path / "p.csv").write_text("name,cpu_milli\nx,1\n")
    with pytest.raises(SpecError, match="a header with name, cpu_milli, memory_mib, num_gpu, gpu_milli"):
        load_tasks(tmp_path / "p.csv")
    with pytest.raises(SpecError, match="one of P100"):
        load_nodes(write_nodes(tmp_path / "n.csv", [("a", 1000, 1000, 1, "H200")]))
    with pytest.raises(SpecError, match="an existing CSV file"):
        load_tasks(tmp_path / "nope.csv")
