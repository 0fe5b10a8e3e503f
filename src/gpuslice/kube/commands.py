"""Kubernetes verbs: ``gpuslice scheduler`` (extender + webhook), ``gpuslice kube-agent`` (device plugin +
node registration + metrics with Kubernetes labels) and ``gpuslice kube-certs`` (webhook TLS files)."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from pathlib import Path
from typing import List, Optional

import typer

from gpuslice.spec.errors import GpusliceError


def _say(text: str) -> None:
    print(f"gpuslice: {text}", file=sys.stderr, flush=True)


def _logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _config(policy: str, default_mem: int, default_cores: int, default_gpu_num: int, scheduler_name: str,
            mode: str, names: dict[str, str] | None = None):
    from gpuslice.kube.resources import KubeConfig, ResourceNames
    from gpuslice.placement import PlacementPolicy
    from gpuslice.spec import ComputeMode

    return KubeConfig(names=ResourceNames.configured(**(names or {})), default_memory_mib=default_mem,
                      default_cores=default_cores, default_gpu_num=default_gpu_num,
                      scheduler_name=scheduler_name, policy=PlacementPolicy.parse(policy),
                      default_mode=ComputeMode.parse(mode, "--mode"))


# HAMi's chart knobs for the resource names (resourceName, resourceMem, resourceMemPercentage,
# resourceCores, resourcePriority), with HAMi's defaults; gpuslice.io/* names are read besides them.
def _name_option(flag: str, default: str, what: str):
    return typer.Option(default, flag, help=f"Resource name of {what} (HAMi's default {default}); "
                        "the gpuslice.io/* name of the same kind is read too.")


def scheduler(
    kubeconfig: Optional[str] = typer.Option(None, "--kubeconfig", help="Kubeconfig file (default: in-cluster, "
                                             "then $KUBECONFIG / ~/.kube/config)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address of the extender (HTTP)."),
    port: int = typer.Option(8888, "--port", help="Port of the extender: /filter /prioritize /bind "
                             "(0 = no extender: a webhook-only process, which needs no API access)."),
    webhook_host: str = typer.Option("0.0.0.0", "--webhook-host", help="Address of the admission webhook (HTTPS)."),
    webhook_port: int = typer.Option(8443, "--webhook-port", help="Port of the webhook: /mutate (0 = no webhook)."),
    tls_cert: Optional[str] = typer.Option(None, "--tls-cert", help="Webhook certificate (PEM)."),
    tls_key: Optional[str] = typer.Option(None, "--tls-key", help="Webhook private key (PEM)."),
    policy: str = typer.Option("binpack", "--policy", help="Cluster policy: binpack, spread, bestfit, fgd, random, "
                               "or node=<p>,gpu=<p>. Pods override it with gpuslice.io/policy."),
    default_mem: int = typer.Option(0, "--default-mem", help="HAMi defaultMem: MiB per device when a pod gives "
                                    "none (0 = the whole device)."),
    default_cores: int = typer.Option(0, "--default-cores", help="HAMi defaultCores: percent when none given."),
    default_gpu_num: int = typer.Option(1, "--default-gpu-num", help="HAMi defaultGPUNum: devices when a pod "
                                        "gives memory or cores but no count."),
    scheduler_name: str = typer.Option("gpuslice-scheduler", "--scheduler-name",
                                       help="schedulerName the webhook sets (the kube-scheduler profile with our extender)."),
    mode: str = typer.Option("hard", "--mode", help="Default compute mode: hard, soft or off."),
    resource_name: str = _name_option("--resource-name", "nvidia.com/gpu",
                                      "the device count (the one the device plugin advertises)"),
    resource_mem: str = _name_option("--resource-mem", "nvidia.com/gpumem", "memory per device in MiB"),
    resource_mem_percentage: str = _name_option("--resource-mem-percentage", "nvidia.com/gpumem-percentage",
                                                "memory per device in percent"),
    resource_cores: str = _name_option("--resource-cores", "nvidia.com/gpucores", "the compute share"),
    resource_priority: str = _name_option("--resource-priority", "nvidia.com/priority", "the task priority"),
    node_cache: bool = typer.Option(True, "--node-cache/--no-node-cache",
                                    help="Watch nodes (needed when kube-scheduler uses nodeCacheCapable: true)."),
    gc_interval: float = typer.Option(15.0, "--gc-interval", help="Seconds between ledger garbage collections."),
    stale_after: float = typer.Option(0.0, "--stale-after", help="Skip nodes whose agent has not published "
                                      "devices for this many seconds (0 = never; HAMi uses 300)."),
    allocation_timeout: float = typer.Option(300.0, "--allocation-timeout", help="The allocation lock: a node "
                                             "takes no second pod of the same device count until the device plugin "
                                             "allocated the first, or this many seconds passed (0 = lock off: "
                                             "Allocate then refuses pods it cannot tell apart)."),
    log_level: str = typer.Option("info", "--log-level"),
) -> None:
    """Serve the scheduler extender (HTTP) and the mutating admission webhook (HTTPS)."""
    from gpuslice.kube.server import make_app, serve_all
    from gpuslice.spec import SpecError

    _logging(log_level)
    cfg = _config(policy, default_mem, default_cores, default_gpu_num, scheduler_name, mode,
                  {"count": resource_name, "memory": resource_mem, "memory_percentage": resource_mem_percentage,
                   "cores": resource_cores, "priority": resource_priority})
    for flag, value in (("--port", port), ("--webhook-port", webhook_port)):
        if not 0 <= value <= 65535:
            raise SpecError(flag, value, "a TCP port 1..65535, or 0 for off")
    if not port and not webhook_port:
        raise GpusliceError("--port 0 and --webhook-port 0 turn both the extender and the webhook off: "
                            "nothing to serve")
    if stale_after < 0:
        raise SpecError("--stale-after", stale_after, "seconds, 0 (never) or more")
    if allocation_timeout < 0:
        raise SpecError("--allocation-timeout", allocation_timeout, "seconds, 0 (lock off) or more")
    if gc_interval <= 0:
        raise SpecError("--gc-interval", gc_interval, "seconds, more than 0")
    if webhook_port and not (tls_cert and tls_key):
        raise GpusliceError("the webhook needs --tls-cert and --tls-key (the API server calls webhooks over "
                            "TLS only); make them with `gpuslice kube-certs` or pass --webhook-port 0")
    servers = []
    if port:
        servers.append((make_app(_start_extender(kubeconfig, cfg, node_cache, gc_interval, stale_after,
                                                 allocation_timeout), cfg, webhook_enabled=False),
                        host, port, None, None))
    if webhook_port:
        servers.append((make_app(None, cfg, webhook_enabled=True), webhook_host, webhook_port, tls_cert, tls_key))
    shown = ([f"extender on http://{host}:{port}"] if port else []) + \
        ([f"webhook on https://{webhook_host}:{webhook_port}/mutate"] if webhook_port else [])
    _say(", ".join(shown))
    asyncio.run(serve_all(servers))


def _start_extender(kubeconfig: str | None, cfg, node_cache: bool, gc_interval: float, stale_after: float,
                    allocation_timeout: float):
    """The extender with its node cache and its garbage-collection thread (only when --port is not 0: a
    webhook-only process makes no API call at all)."""
    from gpuslice.kube.api import connect
    from gpuslice.kube.extender import Extender, NodeCache

    api = connect(kubeconfig)
    cache = NodeCache(api) if node_cache else None
    if cache:
        cache.start()
    extender = Extender(api, cfg, cache=cache, stale_after=stale_after, allocation_timeout=allocation_timeout)

    def collect() -> None:
        stop = threading.Event()
        while not stop.wait(gc_interval):
            try:
                n = extender.collect_garbage()
                if n:
                    logging.getLogger("gpuslice.extender").info("took back %d stale grant(s)", n)
            except Exception as exc:  # the API server may be away for a while
                logging.getLogger("gpuslice.extender").warning("garbage collection: %s", exc)

    threading.Thread(target=collect, name="gpuslice-gc", daemon=True).start()
    return extender


def kube_agent(
    node: Optional[str] = typer.Option(None, "--node", envvar="NODE_NAME", help="This node's name ($NODE_NAME)."),
    kubeconfig: Optional[str] = typer.Option(None, "--kubeconfig", help="Kubeconfig file (default: in-cluster)."),
    resource_name: str = typer.Option("nvidia.com/gpu", "--resource-name", help="Resource advertised to the kubelet "
                                      "(the device count; the same as `gpuslice scheduler --resource-name`)."),
    split_count: int = typer.Option(10, "--split-count", help="Slices per device (HAMi deviceSplitCount)."),
    memory_scaling: float = typer.Option(1.0, "--memory-scaling", help="HAMi deviceMemoryScaling."),
    plugin_dir: str = typer.Option("/var/lib/kubelet/device-plugins", "--plugin-dir",
                                   help="The kubelet's device-plugin folder."),
    socket_name: str = typer.Option("gpuslice.sock", "--socket-name"),
    host_state_dir: str = typer.Option("/var/lib/gpuslice", "--host-state-dir",
                                       help="State folder as the host sees it (slice files, regions)."),
    state_dir: Optional[str] = typer.Option(None, "--state-dir", help="The same folder as this process sees it "
                                            "(default: --host-state-dir)."),
    library: str = typer.Option("/usr/local/gpuslice/lib/libgpuslice.so", "--library",
                                help="Host path of the enforcer library mounted into containers."),
    snapshot: Optional[str] = typer.Option(None, "--snapshot", help="Describe devices from a snapshot "
                                           "(file or bundled name like h100-80gb) instead of NVML."),
    unique_uuids: bool = typer.Option(False, "--unique-uuids", help="Rename snapshot UUIDs per node (fake nodes)."),
    register_only: bool = typer.Option(False, "--register-only", help="Publish the node's devices once and exit."),
    publish_interval: float = typer.Option(30.0, "--publish-interval"),
    rediscover_interval: float = typer.Option(60.0, "--rediscover-interval", help="Seconds between device "
                                              "discoveries (new GPUs advertised, vanished ones Unhealthy; 0 = once)."),
    health_recovery: float = typer.Option(300.0, "--health-recovery", help="Seconds without a fault after which "
                                          "a device NVML answers again is Healthy again (0 = never)."),
    device_nodes: str = typer.Option("auto", "--device-nodes", help="Device nodes in Allocate: auto, always, none."),
    oom_policy: str = typer.Option("return", "--oom-policy", help="The enforcer's answer to an allocation past the "
                                   "limit, written into every slice file: return (out-of-memory error) or kill."),
    fail_open: bool = typer.Option(False, "--fail-open/--no-fail-open", help="On the enforcer's own failure, let "
                                   "calls through unlimited (--fail-open) or refuse them (default)."),
    enforcer_log_level: str = typer.Option("warn", "--enforcer-log-level", help="The enforcer's log level in GPU "
                                           "containers: error, warn, info or debug."),
    metrics_port: int = typer.Option(0, "--metrics-port", help="Serve Prometheus metrics with namespace/pod/"
                                     "container labels on this port (0 = off)."),
    backstop: str = typer.Option("kill", "--backstop", help="What to do with a container whose processes hold more "
                                 "device memory than its slice's limit in NVML's count: kill (report, then kill them "
                                 "after --backstop-grace), report, or off. Needs hostPID (the chart sets it)."),
    backstop_grace: float = typer.Option(5.0, "--backstop-grace", help="Seconds over the limit before a kill."),
    backstop_tolerance: str = typer.Option("256MiB", "--backstop-tolerance", help="Device memory a slice may show "
                                           "above its limit before it counts as over (or 2 percent, if more)."),
    backstop_interval: float = typer.Option(2.0, "--backstop-interval", help="Seconds between backstop checks."),
    log_level: str = typer.Option("info", "--log-level"),
) -> None:
    """Device plugin + node registration (+ metrics) for one Kubernetes node. Also
    `gpuslice agent --kubernetes` (the same command under the local agent's name)."""
    from gpuslice.kube.agent import NodePublisher, Rediscovery, unique_devices
    from gpuslice.kube.api import connect
    from gpuslice.kube.resources import check_resource_name
    from gpuslice.kube.allocator import PluginConfig
    from gpuslice.kube.health import NvmlHealth
    from gpuslice.kube.plugin import DevicePlugin, StaticHealth
    from gpuslice.host.devices import discover, load_snapshot
    from gpuslice.spec import SpecError

    _logging(log_level)
    if not node:
        raise GpusliceError("--node (or $NODE_NAME) is required: the name of the Node this agent serves")
    check_resource_name("--resource-name", resource_name)
    if rediscover_interval < 0:
        raise SpecError("--rediscover-interval", rediscover_interval, "seconds, 0 (discover once) or more")
    if health_recovery < 0:
        raise SpecError("--health-recovery", health_recovery, "seconds, 0 (never recover) or more")

    try:  # checked before any discovery or API call: a bad flag is named at once, nothing started
        cfg = PluginConfig(node=node, resource_name=resource_name, split_count=split_count,
                           memory_scaling=memory_scaling, plugin_dir=Path(plugin_dir), socket_name=socket_name,
                           host_state_dir=Path(host_state_dir),
                           local_state_dir=Path(state_dir) if state_dir else None, host_library=Path(library),
                           device_nodes=device_nodes, oom_policy=oom_policy, fail_open=fail_open,
                           log_level=enforcer_log_level)
    except SpecError as exc:  # name the flag, not the dataclass field
        flags = {"oom_policy": "--oom-policy", "log_level": "--enforcer-log-level", "device_nodes": "--device-nodes",
                 "split_count": "--split-count"}
        raise SpecError(flags.get(exc.field, exc.field), exc.value, exc.allowed) from None

    from gpuslice.host.backstop import Policy

    try:
        policy = Policy.from_options(backstop, backstop_grace, backstop_tolerance)
    except SpecError as exc:
        raise SpecError("--" + exc.field.replace("_", "-"), exc.value, exc.allowed) from None
    if not backstop_interval > 0:
        raise SpecError("--backstop-interval", backstop_interval, "seconds above 0")

    def find_devices():
        found = load_snapshot(snapshot) if snapshot else discover()
        return unique_devices(found, node) if unique_uuids else found

    devices = find_devices()
    api = connect(kubeconfig)
    publisher = NodePublisher(api, node, devices, split_count=split_count, memory_scaling=memory_scaling,
                              interval=publish_interval)
    if register_only:
        publisher.publish()
        _say(f"published {len(devices)} device(s) on node {node}")
        return
    health = (StaticHealth() if snapshot or os.environ.get("GPUSLICE_DEVICE_SNAPSHOT")
              else NvmlHealth(recover_seconds=health_recovery))
    plugin = DevicePlugin(cfg, devices, api, health=health, on_health=publisher.health_changed,
                          on_devices=publisher.devices_changed)
    publisher.start()
    if rediscover_interval:
        Rediscovery(find_devices, plugin.set_devices, rediscover_interval).start()
    guard = _start_backstop(api, node, devices, policy, backstop_interval)
    if metrics_port:
        _serve_metrics(api, node, devices, cfg.local_state, metrics_port, guard)
    _say(f"device plugin for {resource_name} ({len(devices)} device(s) × {split_count}) on {cfg.socket_path}")
    plugin.run()


def _start_backstop(api, node: str, devices, policy, interval: float):
    """The backstop thread (gpuslice.kube.backstop), or None when it is off or NVML cannot count processes."""
    from gpuslice.host.backstop import Backstop, default_source
    from gpuslice.kube.backstop import KubeBackstop
    from gpuslice.kube.labels import LedgerLabels

    if policy.action == "off":
        return None
    uuids = [u for d in devices for u in ((m.uuid for m in d.mig_instances) if d.mig_instances else (d.uuid,))]
    source = default_source(uuids)
    if source is None:
        _say("backstop off: no per-process device memory (a device snapshot, or NVML without process counts)")
        return None
    labels = LedgerLabels(api, node, ttl=interval)
    guard = KubeBackstop(Backstop(source, policy), labels.ledger,
                         lambda: api.list_pods(field_selector=f"spec.nodeName={node}"), interval=interval)
    guard.start()
    _say(f"backstop: {policy.action}, grace {policy.grace:g} s, every {interval:g} s")
    return guard


def _serve_metrics(api, node: str, devices, state_dir: Path, port: int, guard=None) -> None:
    from prometheus_client import CollectorRegistry, start_http_server

    from gpuslice.kube.labels import KubeLabelCollector, LedgerLabels, watched_grants
    from gpuslice.host.metrics import ViewCollector
    from gpuslice.host.monitor import Monitor, with_backstop

    monitor = Monitor(devices, node)
    labels = LedgerLabels(api, node)

    def view():
        sampled = monitor.sample(watched_grants(labels.ledger(), state_dir))
        latest = guard.latest if guard is not None else None
        return with_backstop(sampled, latest) if latest is not None else sampled

    registry = CollectorRegistry()
    registry.register(KubeLabelCollector(ViewCollector(view), labels))
    start_http_server(port, registry=registry)
    _say(f"metrics on :{port}/metrics")


def kube_certs(
    directory: str = typer.Option(..., "--dir", help="Folder for ca.crt, tls.crt and tls.key."),
    hosts: List[str] = typer.Option(["localhost", "127.0.0.1"], "--host", help="DNS names / IPs of the webhook "
                                    "(repeat), e.g. gpuslice-webhook.gpuslice.svc."),
) -> None:
    """Write a self-signed CA and webhook certificate; prints the CA path (the caBundle)."""
    from gpuslice.kube.certs import write_self_signed

    files = write_self_signed(directory, hosts)
    typer.echo(str(files.ca))


def register(app: typer.Typer) -> None:
    app.command("scheduler")(scheduler)
    app.command("kube-agent")(kube_agent)
    app.command("kube-certs")(kube_certs)
