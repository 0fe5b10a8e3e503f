"""The agent's memory of the last minutes: one point per sample per slice and per device."""

from __future__ import annotations

from collections import deque
from typing import Any

from gpuslice.host.monitor import NodeView

DEFAULT_POINTS = 600  # 10 minutes at one sample per second


class History:
    """Fixed-size rings of (time, memory used, compute achieved) per slice key and per device."""

    def __init__(self, points: int = DEFAULT_POINTS):
        if points < 2:
            raise ValueError(f"history points: {points} is not allowed; expected at least 2")
        self.points = points
        self.times: deque[float] = deque(maxlen=points)
        self.slices: dict[str, dict[str, deque]] = {}
        self.devices: dict[str, dict[str, deque]] = {}
        self.meta: dict[str, dict[str, Any]] = {}

    def add(self, view: NodeView) -> None:
        self.times.append(view.time)
        for s in view.slices:
            key = f"{s.grant_id}/{s.device_index}"
            self.meta[key] = {"grant_id": s.grant_id, "device_index": s.device_index, "owner": s.owner,
                              "memory_limit": s.memory_limit, "compute_set": s.compute_set}
            self._put(self.slices, key, view.time, s.memory_used, s.compute_achieved)
        for d in view.devices:
            self._put(self.devices, str(d.index), view.time, d.memory_used, d.compute_achieved)
        live = {f"{s.grant_id}/{s.device_index}" for s in view.slices}
        oldest = self.times[0]
        for key in [k for k, ring in self.slices.items() if k not in live and (not ring["t"] or ring["t"][-1] < oldest)]:
            del self.slices[key]
            self.meta.pop(key, None)

    def _put(self, table: dict[str, dict[str, deque]], key: str, t: float, mem: int, comp: float | None) -> None:
        ring = table.setdefault(key, {n: deque(maxlen=self.points) for n in ("t", "memory", "compute")})
        ring["t"].append(t)
        ring["memory"].append(mem)
        ring["compute"].append(comp)

    def to_json(self, since: float = 0.0) -> dict[str, Any]:
        def cut(ring: dict[str, deque]) -> dict[str, list]:
            first = next((i for i, t in enumerate(ring["t"]) if t > since), len(ring["t"]))  # times ascend
            return {n: list(ring[n])[first:] for n in ring}

        return {"t": [t for t in self.times if t > since],
                "slices": {k: {**self.meta.get(k, {}), **cut(r)} for k, r in self.slices.items()},
                "devices": {k: cut(r) for k, r in self.devices.items()}}
