"""Pick who grants: the agent when one answers on its socket, else the ledger file directly."""

from __future__ import annotations

from gpuslice.node.client import AgentClient, GrantService, find_agent_socket
from gpuslice.node.paths import StateDir
from gpuslice.spec import Device


def open_service(state: StateDir) -> tuple[GrantService, list[Device]]:
    """The grant service and the node's devices (from the agent, or discovered here)."""
    socket_path = find_agent_socket(state)
    if socket_path is not None:
        client = AgentClient(socket_path)
        return client, client.devices()
    from gpuslice.node.devices import discover
    from gpuslice.node.ledger import Ledger
    from gpuslice.node.region_usage import region_pids

    devices = discover()
    return Ledger(state, devices, region_pids=region_pids), devices
