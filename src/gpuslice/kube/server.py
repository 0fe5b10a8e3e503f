"""HTTP(S) endpoints of ``gpuslice scheduler``: the extender and the admission webhook, on Starlette + uvicorn.

Routes (all ``POST`` with JSON bodies, except the probes):

=====================  ==================================================================
``/filter``            ExtenderArgs -> ExtenderFilterResult
``/prioritize``        ExtenderArgs -> HostPriorityList
``/bind``              ExtenderBindingArgs -> ExtenderBindingResult
``/mutate``            AdmissionReview (admission.k8s.io/v1) -> AdmissionReview with a JSONPatch
``/healthz``           ``GET`` -> ``ok``
=====================  ==================================================================

A body that is not JSON or not the expected shape gets **400** with ``{"error": "..."}`` naming what is
wrong; an unexpected failure inside gets 500 with the message (the server keeps running).

:func:`start_in_thread` runs an app on a loopback port in the background (tests, the e2e harness) and
returns a handle with ``url`` and ``stop()``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from gpuslice.kube import resources, webhook
from gpuslice.kube.extender import BadRequest, Extender
from gpuslice.kube.tlsreload import ReloadingTLS

log = logging.getLogger("gpuslice.server")
MAX_BODY = 64 * 1024 * 1024  # 5,000 full Node objects are ~30 MiB


async def _json(request: Request) -> Any:
    body = await request.body()
    if len(body) > MAX_BODY:
        raise BadRequest(f"body of {len(body)} bytes is larger than {MAX_BODY}")
    if not body:
        raise BadRequest("empty body; expected a JSON document")
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not JSON: {exc}") from None


def _endpoint(handler: Callable[[Any], Any], bad: tuple[type[Exception], ...]):
    async def endpoint(request: Request) -> JSONResponse:
        try:
            payload = await _json(request)
            result = await run_in_threadpool(handler, payload)
        except bad as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        except Exception as exc:  # never take the server down with one request
            log.exception("%s failed", request.url.path)
            return JSONResponse({"error": f"internal error: {type(exc).__name__}: {exc}"}, status_code=500)
        return JSONResponse(result)
    return endpoint


def make_app(extender: Extender | None = None, cfg: resources.KubeConfig | None = None, *,
             webhook_enabled: bool = True, quota: webhook.QuotaCheck | None = None) -> Starlette:
    """The Starlette app: extender routes when ``extender`` is given, ``/mutate`` when ``webhook_enabled``
    (checking namespace GPU quotas with ``quota``, :class:`gpuslice.kube.quota.AdmissionQuota`)."""
    cfg = cfg or (extender.cfg if extender else resources.KubeConfig())
    routes = [Route("/healthz", lambda r: PlainTextResponse("ok"), methods=["GET"])]
    if extender is not None:
        routes += [Route("/filter", _endpoint(extender.filter, (BadRequest,)), methods=["POST"]),
                   Route("/prioritize", _endpoint(extender.prioritize, (BadRequest,)), methods=["POST"]),
                   Route("/bind", _endpoint(extender.bind, (BadRequest,)), methods=["POST"])]
    if webhook_enabled:
        routes.append(Route("/mutate", _endpoint(lambda body: webhook.mutate(body, cfg, quota), (webhook.BadReview, BadRequest)),
                            methods=["POST"]))
    return Starlette(routes=routes)


# ---------------------------------------------------------------------------------------- serving
@dataclass
class Running:
    """A server started by :func:`start_in_thread`."""

    url: str
    port: int
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and
    # without it uvicorn's separate header and body writes wait ~40 ms for the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # inherited by accepted sockets on Linux
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _config(app: Starlette, certfile: str | None, keyfile: str | None, workers_limit: int | None,
            tls_check_interval: float = 1.0) -> uvicorn.Config:
    kwargs: dict[str, Any] = {"log_level": "warning", "access_log": False, "lifespan": "off",
                              "timeout_keep_alive": 30, "limit_concurrency": workers_limit}
    if certfile:
        def reloading(config: uvicorn.Config, default: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
            # uvicorn's own context (ciphers, ALPN), rebuilt from the files whenever they change: a renewed
            # certificate (cert-manager, the chart's job) is served without a restart.
            return ReloadingTLS(certfile, keyfile, default, interval=tls_check_interval).listening_context()

        kwargs.update(ssl_certfile=certfile, ssl_keyfile=keyfile, ssl_context_factory=reloading)
    return uvicorn.Config(app, **kwargs)


def start_in_thread(app: Starlette, host: str = "127.0.0.1", port: int = 0, *, certfile: str | None = None,
                    keyfile: str | None = None, timeout: float = 10.0, tls_check_interval: float = 1.0) -> Running:
    """Serve ``app`` on ``host:port`` (0 = any free port) in a daemon thread; TLS when ``certfile`` (the files
    are re-read when they change, at most every ``tls_check_interval`` seconds)."""
    sock = bind_socket(host, port)
    actual = sock.getsockname()[1]
    server = uvicorn.Server(_config(app, certfile, keyfile, None, tls_check_interval))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # not the main thread

    def run() -> None:
        asyncio.run(server.serve(sockets=[sock]))

    thread = threading.Thread(target=run, name=f"gpuslice-http-{actual}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the HTTP server on {host}:{actual} did not start")
        time.sleep(0.01)
    scheme = "https" if certfile else "http"
    shown = f"[{host}]" if ":" in host else host
    return Running(f"{scheme}://{shown}:{actual}", actual, server, thread)


async def serve_all(servers: list[tuple[Starlette, str, int, str | None, str | None]]) -> None:
    """Serve several apps (the extender over HTTP, the webhook over HTTPS) in one event loop."""
    tasks = []
    for app, host, port, cert, key in servers:
        sock = bind_socket(host, port)
        server = uvicorn.Server(_config(app, cert, key, None))
        tasks.append(asyncio.create_task(server.serve(sockets=[sock])))
    await asyncio.gather(*tasks)


def client_ssl_context(ca_file: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca_file)
    return ctx
