"""The refusal a person reads when a request does not fit this node now: devices by their index, what is
free, and what to do next (queue with ``--wait``, ask for less, look with ``gpuslice ps``).

Placement explains in UUIDs and node names (it serves a cluster); on one machine people say ``GPU 0``,
so the ledger names the devices it knows and drops the node. The numbers of "ask for less" come from the
node's state now, with the request's compute share and slot counted, so the size offered fits.
"""

from __future__ import annotations

import math
from typing import Sequence

from gpuslice.placement import NodeState, TaskShape
from gpuslice.placement.model import describe_free
from gpuslice.placement.whynot import name_devices
from gpuslice.spec import Device, GiB, MiB, Request


def device_names(devices: Sequence[Device]) -> dict[str, str]:
    """UUID → ``GPU 0``; MIG instances → ``GPU 0 MIG 1`` (their order on the card)."""
    names = {}
    for d in devices:
        names[d.uuid] = f"GPU {d.index}"
        for k, m in enumerate(d.mig_instances):
            names[m.uuid] = f"GPU {d.index} MIG {k}"
    return names


def local_words(text: str, node: NodeState, devices: Sequence[Device]) -> str:
    """Placement's reason in this machine's words: device indexes, no node name."""
    text = name_devices(text, device_names(devices))
    return text.replace(f" (node {node.name})", "").replace(" on one node", "")


def _size(size: int) -> str:
    """A size that is at most ``size``, as ``--memory`` takes it (rounded down: it must still fit)."""
    if size >= GiB:
        return f"{math.floor(size / GiB * 10) / 10:g}GiB"
    return f"{size // MiB}MiB"


def smaller_request(request: Request, node: NodeState) -> list[str]:
    """What of the same kind fits now, as options (``--memory 9.6GiB``, ``--compute 50``, ``--gpus 2``);
    empty when nothing smaller does."""
    if TaskShape.of(request).whole:
        idle = sum(1 for d in node.devices if d.is_idle)
        return [f"--gpus {idle}"] if 0 < idle < request.count else []
    need = request.memory.bytes if request.memory is not None else None
    open_ = [d for d in node.devices if d.free_slots > 0]
    out = []
    room = sorted((d.free_memory for d in open_ if d.free_compute >= request.compute), reverse=True)
    if len(room) >= request.count and room[request.count - 1] >= MiB:
        out.append(f"--memory {_size(room[request.count - 1])}")
    if request.compute:  # the memory fits somewhere, the compute share does not
        shares = sorted((d.free_compute for d in open_ if need is None or d.free_memory >= need), reverse=True)
        if len(shares) >= request.count and 0 < shares[request.count - 1] < request.compute:
            out.append(f"--compute {shares[request.count - 1]}")
    return out


def refusal(reason: str, node: NodeState, devices: Sequence[Device], request: Request, wait: bool,
            usable: NodeState) -> str:
    """The whole refusal: why (named by index), what is free, and the next steps that apply. Sizes that fit now
    are offered from ``usable``, the devices the request may take with the engines it may have (a device running
    the other engine takes no size of it)."""
    names = device_names(devices)
    steps = [] if wait else ["--wait queues it until it fits"]
    smaller = smaller_request(request, usable)
    if smaller:
        steps.append(f"{' or '.join(smaller)} fits now")
    steps.append("`gpuslice ps` shows who holds the devices")
    return (f"does not fit now: {local_words(reason, node, devices)}\n"
            f"free now: {describe_free(node, names)}\n"
            f"next: {'; '.join(steps)}")


__all__ = ["device_names", "local_words", "refusal", "smaller_request"]
