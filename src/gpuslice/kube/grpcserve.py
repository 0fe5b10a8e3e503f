"""gRPC servers on Unix sockets, as the kubelet's plugin APIs want them (the device plugin, the DRA plugin)."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path
from typing import Callable, Sequence

import grpc

from gpuslice.spec import GpusliceError


def serve_unix(paths: Sequence[Path], add_services: Callable[[grpc.Server], None], *, workers: int,
               name: str) -> grpc.Server:
    """A started server listening on every socket of ``paths`` (folders made, stale files replaced), with
    the services ``add_services`` adds; :class:`GpusliceError` when a socket cannot be bound."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name))
    add_services(server)
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        if server.add_insecure_port(f"unix://{path}") == 0:
            raise GpusliceError(f"cannot listen on {path}")
    server.start()
    return server


def stop(server: grpc.Server | None) -> None:
    """Stop ``server`` (half a second's grace for calls in flight) and wait for it, at most 2 s."""
    if server is not None:
        server.stop(grace=0.5).wait(2)
