"""Where ``ps``/``top`` get a NodeView: the agent when one runs (it has compute rates), else the ledger."""

from __future__ import annotations

from dataclasses import replace

from gpuslice.local.client import AgentClient, find_agent_socket
from gpuslice.host.monitor import Monitor, NodeView, view_from_json
from gpuslice.local.paths import StateDir


class ViewSource:
    def __init__(self, state: StateDir):
        socket_path = find_agent_socket(state)
        self.client = AgentClient(socket_path) if socket_path else None
        self.ledger = None
        self.monitor = None
        if self.client is None:
            from gpuslice.host.devices import discover
            from gpuslice.local.ledger import Ledger, recorded_pids

            devices = discover()
            self.ledger = Ledger(state, devices, region_pids=recorded_pids)
            self.monitor = Monitor(devices, self.ledger.node_name, device_state_dir=state.device_state,
                                   mps=self.ledger.mps)

    @property
    def where(self) -> str:
        return f"agent {self.client.socket_path}" if self.client else f"ledger {self.ledger.state.ledger}"

    def view(self) -> NodeView:
        if self.client is not None:
            return view_from_json(self.client.status())
        assert self.ledger is not None and self.monitor is not None
        try:
            self.ledger.reclaim()
        except Exception:  # a read-only state dir: show what is recorded
            pass
        view = self.monitor.sample([g.watched() for g in self.ledger.grants()], self.ledger.waiters())
        return replace(view, errors=(*view.errors, *self.ledger.problems()))
