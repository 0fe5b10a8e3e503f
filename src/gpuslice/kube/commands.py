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

from gpuslice.host.cliargs import existing_file, named_file, option_values, usage


def _say(text: str) -> None:
    print(f"gpuslice: {text}", file=sys.stderr, flush=True)


def _logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


# Fields of the validated config → the flags they came from, so a refusal names what was typed.
SCHEDULER_FLAGS = {"resource name (count)": "--resource-name", "resource name (memory)": "--resource-mem",
                   "resource name (memory_percentage)": "--resource-mem-percentage",
                   "resource name (cores)": "--resource-cores", "resource name (priority)": "--resource-priority",
                   "default_memory_mib": "--default-mem", "high_priority_namespaces": "--high-priority-namespace"}


def _config(policy: str, default_mem: int, default_cores: int, default_gpu_num: int, scheduler_name: str,
            mode: str, names: dict[str, str] | None = None, adopt: tuple[str, ...] = ("default-scheduler",),
            engine: str = "timeslice", colocation: str = "preemptive", high_priority: tuple[str, ...] = ("*",)):
    from gpuslice.kube.resources import HighPriorityNamespaces, KubeConfig, ResourceNames
    from gpuslice.placement import PlacementPolicy
    from gpuslice.spec import Colocation, ComputeMode, Engine

    return KubeConfig(names=ResourceNames.configured(**(names or {})), default_memory_mib=default_mem,
                      default_cores=default_cores, default_gpu_num=default_gpu_num,
                      scheduler_name=scheduler_name, policy=PlacementPolicy.parse(policy),
                      default_mode=ComputeMode.parse(mode, "--mode"), adopt_schedulers=adopt,
                      default_engine=Engine.parse(engine, "--default-engine"),
                      default_colocation=Colocation.parse(colocation, "--default-colocation"),
                      high_priority=HighPriorityNamespaces(tuple(high_priority)))


# HAMi's chart knobs for the resource names (resourceName, resourceMem, resourceMemPercentage,
# resourceCores, resourcePriority), with HAMi's defaults; gpuslice.io/* names are read besides them.
def _name_option(flag: str, default: str, what: str):
    return typer.Option(default, flag, metavar="NAME", help=f"Resource name of {what} (HAMi's default {default}); "
                        "the gpuslice.io/* name of the same kind is read too.")


def scheduler(
    kubeconfig: Optional[str] = typer.Option(None, "--kubeconfig", metavar="FILE",
                                             help="Kubeconfig file (default: in-cluster, "
                                             "then $KUBECONFIG / ~/.kube/config)."),
    host: str = typer.Option("127.0.0.1", "--host", metavar="ADDR", help="Address of the extender (HTTP)."),
    port: int = typer.Option(8888, "--port", metavar="PORT", help="Port of the extender: /filter /prioritize /bind "
                             "(0 = no extender: a webhook-only process, which needs no API access)."),
    webhook_host: str = typer.Option("0.0.0.0", "--webhook-host", metavar="ADDR",
                                     help="Address of the admission webhook (HTTPS)."),
    webhook_port: int = typer.Option(8443, "--webhook-port", metavar="PORT",
                                     help="Port of the webhook: /mutate (0 = no webhook)."),
    tls_cert: Optional[str] = typer.Option(None, "--tls-cert", metavar="FILE", help="Webhook certificate (PEM)."),
    tls_key: Optional[str] = typer.Option(None, "--tls-key", metavar="FILE", help="Webhook private key (PEM)."),
    policy: str = typer.Option("binpack", "--policy", metavar="POLICY",
                               help="Cluster policy: binpack, spread, bestfit, fgd, random, "
                               "or node=<p>,gpu=<p>. Pods override it with gpuslice.io/policy."),
    default_mem: int = typer.Option(0, "--default-mem", metavar="MIB",
                                    help="HAMi defaultMem: MiB per device when a pod gives none (0 = the whole "
                                    "device, or a compute-only container's cores percent of it)."),
    default_cores: int = typer.Option(0, "--default-cores", metavar="PCT",
                                      help="HAMi defaultCores: percent when none given."),
    default_gpu_num: int = typer.Option(1, "--default-gpu-num", metavar="N",
                                        help="HAMi defaultGPUNum: devices when a pod "
                                        "gives memory or cores but no count."),
    scheduler_name: str = typer.Option("gpuslice-scheduler", "--scheduler-name", metavar="NAME",
                                       help="schedulerName the webhook sets (the kube-scheduler profile with our extender)."),
    mode: str = typer.Option("hard", "--mode", metavar="hard|soft|off",
                             help="Default compute mode: hard, soft or off."),
    default_engine: str = typer.Option("timeslice", "--default-engine", metavar="timeslice|spatial",
                                       help="Engine of pods without gpuslice.io/engine (or HAMi's vgpu-mode: mps): "
                                       "timeslice or spatial (MPS)."),
    default_colocation: str = typer.Option("preemptive", "--default-colocation", metavar="preemptive|shared|tidal",
                                           help="Co-location of pods without gpuslice.io/colocation (tidal: "
                                           "low-priority hard containers only; the others stay preemptive)."),
    resource_name: str = _name_option("--resource-name", "nvidia.com/gpu",
                                      "the device count (the one the device plugin advertises)"),
    resource_mem: str = _name_option("--resource-mem", "nvidia.com/gpumem", "memory per device in MiB"),
    resource_mem_percentage: str = _name_option("--resource-mem-percentage", "nvidia.com/gpumem-percentage",
                                                "memory per device in percent"),
    resource_cores: str = _name_option("--resource-cores", "nvidia.com/gpucores", "the compute share"),
    resource_priority: str = _name_option("--resource-priority", "nvidia.com/priority", "the task priority"),
    node_cache: bool = typer.Option(True, "--node-cache/--no-node-cache",
                                    help="Watch nodes (needed when kube-scheduler uses nodeCacheCapable: true)."),
    gc_interval: float = typer.Option(15.0, "--gc-interval", metavar="SECONDS",
                                      help="Seconds between ledger garbage collections."),
    stale_after: float = typer.Option(0.0, "--stale-after", metavar="SECONDS",
                                      help="Skip nodes whose agent has not published "
                                      "devices for this many seconds (0 = never; HAMi uses 300)."),
    allocation_timeout: float = typer.Option(300.0, "--allocation-timeout", metavar="SECONDS",
                                             help="The allocation lock: a node "
                                             "takes no second pod of the same device count until the device plugin "
                                             "allocated the first, or this many seconds passed (0 = lock off: "
                                             "Allocate then refuses pods it cannot tell apart)."),
    adopt_scheduler: List[str] = typer.Option(["default-scheduler"], "--adopt-scheduler", metavar="NAME",
                                              help="Send GPU pods naming this scheduler (repeat; and pods naming none) "
                                              "to --scheduler-name; pods naming another are left to it, as HAMi does."),
    high_priority_namespace: List[str] = typer.Option(
        ["*"], "--high-priority-namespace", metavar="NS",
        help="A namespace whose pods and claims may ask for high priority (nvidia.com/priority: 0, a resize to "
        "priority high); repeat for more. '*' (the default, as HAMi) = every namespace; one empty value = none. High priority makes "
        "the low-priority slices on its devices wait while its work is queued: refused elsewhere with 403."),
    quotas: bool = typer.Option(True, "--quotas/--no-quotas", help="Enforce namespace GPU quotas "
                                "(ResourceQuota limits.nvidia.com/gpumem, gpucores, gpu) at admission and bind; "
                                "the webhook then reads ResourceQuotas and the namespace's pods."),
    metrics_port: int = typer.Option(0, "--metrics-port", metavar="PORT", help="Serve Prometheus metrics of the "
                                     "extender (namespace GPU quota limits and use) on this port, all addresses "
                                     "(0 = off)."),
    log_level: str = typer.Option("info", "--log-level", metavar="LEVEL"),
) -> None:
    """Serve the scheduler extender (HTTP) and the mutating admission webhook (HTTPS)."""
    from gpuslice.kube.server import make_app, serve_all
    from gpuslice.spec import SpecError

    _logging(log_level)
    with option_values(SCHEDULER_FLAGS):  # what was typed wrong: exit 2, naming the flag
        cfg = _config(policy, default_mem, default_cores, default_gpu_num, scheduler_name, mode,
                      {"count": resource_name, "memory": resource_mem, "memory_percentage": resource_mem_percentage,
                       "cores": resource_cores, "priority": resource_priority}, tuple(adopt_scheduler), default_engine,
                      default_colocation, tuple(n for n in high_priority_namespace if n))
        for flag, value in (("--port", port), ("--webhook-port", webhook_port), ("--metrics-port", metrics_port)):
            if not 0 <= value <= 65535:
                raise SpecError(flag, value, "a TCP port 1..65535, or 0 for off")
        if stale_after < 0:
            raise SpecError("--stale-after", stale_after, "seconds, 0 (never) or more")
        if allocation_timeout < 0:
            raise SpecError("--allocation-timeout", allocation_timeout, "seconds, 0 (lock off) or more")
        if gc_interval <= 0:
            raise SpecError("--gc-interval", gc_interval, "seconds, more than 0")
    if not port and not webhook_port:
        raise usage("--port 0 and --webhook-port 0 turn both the extender and the webhook off: nothing to serve")
    if webhook_port and not (tls_cert and tls_key):
        raise usage("the webhook needs --tls-cert and --tls-key (the API server calls webhooks over TLS only); "
                    "make them with `gpuslice kube-certs` or pass --webhook-port 0")
    if metrics_port and not port:
        raise usage("--metrics-port serves the extender's metrics: it needs the extender (--port)")
    # files named for the parts that will run (a webhook-only process never reads a kubeconfig)
    for flag, path, used in (("--kubeconfig", kubeconfig, port), ("--tls-cert", tls_cert, webhook_port),
                             ("--tls-key", tls_key, webhook_port)):
        if path and used:
            existing_file(path, flag)
    servers = []
    if port:
        extender = _start_extender(kubeconfig, cfg, node_cache, gc_interval, stale_after, allocation_timeout, quotas)
        servers.append((make_app(extender, cfg, webhook_enabled=False), host, port, None, None))
        if metrics_port:
            _serve_extender_metrics(extender, metrics_port)
    if webhook_port:
        servers.append((make_app(None, cfg, webhook_enabled=True, quota=_admission_quota(kubeconfig, cfg) if quotas else None),
                        webhook_host, webhook_port, tls_cert, tls_key))
    shown = ([f"extender on http://{host}:{port}"] if port else []) + \
        ([f"webhook on https://{webhook_host}:{webhook_port}/mutate"] if webhook_port else [])
    _say(", ".join(shown))
    asyncio.run(serve_all(servers))


def _admission_quota(kubeconfig: str | None, cfg):
    """The webhook's quota check: it reads the namespace's ResourceQuotas and pods for each GPU pod (the
    only API calls a webhook-only process makes; with --no-quotas it makes none)."""
    from gpuslice.kube.api import KubeError, connect
    from gpuslice.kube.quota import AdmissionQuota

    try:
        return AdmissionQuota(connect(kubeconfig), cfg)
    except KubeError as exc:  # no credentials: the extender still enforces quotas at bind
        _say(f"webhook: namespace quotas are not checked at admission: {exc}")
        return None


def _serve_extender_metrics(extender, port: int) -> None:
    from prometheus_client import CollectorRegistry, start_http_server

    from gpuslice.kube.quota import QuotaCollector

    registry = CollectorRegistry()
    if extender.quota is not None:
        registry.register(QuotaCollector(extender.quota, extender.granted))
    start_http_server(port, registry=registry)
    _say(f"extender metrics on :{port}/metrics")


def _start_extender(kubeconfig: str | None, cfg, node_cache: bool, gc_interval: float, stale_after: float,
                    allocation_timeout: float, quotas: bool = True):
    """The extender with its node cache and its garbage-collection thread (only when --port is not 0)."""
    from gpuslice.kube.api import connect
    from gpuslice.kube.extender import Extender, NodeCache

    api = connect(kubeconfig)
    cache = NodeCache(api) if node_cache else None
    usage = None
    if cache:
        cache.start()
        # CPU and memory of the pods on each node, for FGD and best-fit (kube-scheduler filters them itself).
        from gpuslice.kube.extender.usage import PodUsage

        usage = PodUsage(api)
        usage.start()
    extender = Extender(api, cfg, cache=cache, stale_after=stale_after, allocation_timeout=allocation_timeout,
                        quotas=quotas, usage=usage)

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
    from gpuslice.kube.extender.resize import LedgerResizer

    LedgerResizer(api, high_priority=cfg.high_priority).start()  # live resize: the ledger side (gpuslice.kube.resize)
    return extender


def kube_agent(
    node: Optional[str] = typer.Option(None, "--node", metavar="NAME",
                                       envvar="NODE_NAME", help="This node's name ($NODE_NAME)."),
    kubeconfig: Optional[str] = typer.Option(None, "--kubeconfig", metavar="FILE",
                                             help="Kubeconfig file (default: in-cluster)."),
    resource_name: str = typer.Option("nvidia.com/gpu", "--resource-name", metavar="NAME",
                                      help="Resource advertised to the kubelet "
                                      "(the device count; the same as `gpuslice scheduler --resource-name`)."),
    split_count: int = typer.Option(10, "--split-count", metavar="N",
                                    help="Slices per device (HAMi deviceSplitCount)."),
    memory_scaling: float = typer.Option(1.0, "--memory-scaling", metavar="X", help="HAMi deviceMemoryScaling."),
    plugin_dir: str = typer.Option("/var/lib/kubelet/device-plugins", "--plugin-dir", metavar="DIR",
                                   help="The kubelet's device-plugin folder."),
    socket_name: str = typer.Option("gpuslice.sock", "--socket-name", metavar="NAME"),
    host_state_dir: str = typer.Option("/var/lib/gpuslice", "--host-state-dir", metavar="DIR",
                                       help="State folder as the host sees it (slice files, regions)."),
    state_dir: Optional[str] = typer.Option(None, "--state-dir", metavar="DIR",
                                            help="The same folder as this process sees it "
                                            "(default: --host-state-dir)."),
    library: str = typer.Option("/usr/local/gpuslice/lib/libgpuslice.so", "--library", metavar="FILE",
                                help="Host path of the enforcer library mounted into containers."),
    snapshot: Optional[str] = typer.Option(None, "--snapshot", metavar="NAME|FILE",
                                           help="Describe devices from a snapshot "
                                           "(file or bundled name like h100-80gb) instead of NVML."),
    unique_uuids: bool = typer.Option(False, "--unique-uuids", help="Rename snapshot UUIDs per node (fake nodes)."),
    register_only: bool = typer.Option(False, "--register-only", help="Publish the node's devices once and exit."),
    publish_interval: float = typer.Option(30.0, "--publish-interval", metavar="SECONDS"),
    rediscover_interval: float = typer.Option(60.0, "--rediscover-interval", metavar="SECONDS",
                                              help="Seconds between device "
                                              "discoveries (new GPUs advertised, vanished ones Unhealthy; 0 = once)."),
    health_recovery: float = typer.Option(300.0, "--health-recovery", metavar="SECONDS",
                                          help="Seconds without a fault after which "
                                          "a device NVML answers again is Healthy again (0 = never)."),
    device_nodes: str = typer.Option("auto", "--device-nodes", metavar="auto|always|none",
                                     help="Device nodes in Allocate: auto, always, none."),
    oom_policy: str = typer.Option("return", "--oom-policy", metavar="return|kill|wait",
                                   help="The enforcer's answer when memory runs out, written into every slice "
                                   "file: return (out-of-memory error), kill (at the limit), or wait (an "
                                   "allocation that fits the slice but not the full device waits for memory)."),
    oom_wait_ms: int = typer.Option(30000, "--oom-wait-ms", metavar="MS",
                                    help="With --oom-policy wait: how long an allocation waits for the device."),
    fail_open: bool = typer.Option(False, "--fail-open/--no-fail-open", help="On the enforcer's own failure, let "
                                   "calls through unlimited (--fail-open) or refuse them (default)."),
    enforcer_log_level: str = typer.Option("warn", "--enforcer-log-level", metavar="LEVEL",
                                           help="The enforcer's log level in GPU "
                                           "containers: error, warn, info or debug."),
    metrics_port: int = typer.Option(0, "--metrics-port", metavar="PORT",
                                     help="Serve Prometheus metrics with namespace/pod/"
                                     "container labels on this port (0 = off)."),
    backstop: str = typer.Option("kill", "--backstop", help="What to do with a container whose processes hold more "
                                 "device memory than its slice's limit in NVML's count: kill (report, then kill them "
                                 "after --backstop-grace), report, or off. Needs hostPID (the chart sets it)."),
    backstop_grace: float = typer.Option(5.0, "--backstop-grace", help="Seconds over the limit before a kill."),
    backstop_tolerance: str = typer.Option("256MiB", "--backstop-tolerance", help="Device memory a slice may show "
                                           "above its limit before it counts as over (or 2 percent, if more)."),
    backstop_interval: float = typer.Option(2.0, "--backstop-interval", help="Seconds between backstop checks."),
    dra: bool = typer.Option(False, "--dra", help="Serve as a DRA driver (ResourceSlice with consumable memory/"
                             "compute, kubelet DRA plugin, CDI specs) instead of a device plugin."),
    dra_plugin_dir: str = typer.Option("/var/lib/kubelet/plugins/gpuslice.io", "--dra-plugin-dir", metavar="DIR",
                                       help="--dra: folder of the DRA service socket (dra.sock)."),
    dra_registry_dir: str = typer.Option("/var/lib/kubelet/plugins_registry", "--dra-registry-dir", metavar="DIR",
                                         help="--dra: the kubelet's plugin registration folder."),
    cdi_dir: str = typer.Option("/var/run/cdi", "--cdi-dir", metavar="DIR",
                                help="--dra: where CDI specs of prepared claims go."),
    min_memory: str = typer.Option("1Gi", "--min-memory", metavar="SIZE", help="--dra: the smallest memory slice a "
                                   "claim may take (smaller requests are rounded up to it)."),
    compute_mode: str = typer.Option("hard", "--compute-mode", metavar="hard|soft|off",
                                     help="--dra: compute mode of claims that set none: hard, soft or off."),
    high_priority_namespace: List[str] = typer.Option(
        ["*"], "--high-priority-namespace", metavar="NS",
        help="--dra: a namespace whose claims may set SliceParameters priority: high (repeat; '*', the default, "
        "= every namespace, one empty value = none); a claim elsewhere is not prepared (the pod does not start), its event naming why."),
    log_level: str = typer.Option("info", "--log-level", metavar="LEVEL"),
) -> None:
    """Device plugin (or, with --dra, DRA driver) + node registration (+ metrics) for one Kubernetes node. Also
    `gpuslice agent --kubernetes` (the same command under the local agent's name)."""
    from gpuslice.kube.agent import NodePublisher, Rediscovery, unique_devices
    from gpuslice.kube.api import connect
    from gpuslice.kube.resources import check_resource_name
    from gpuslice.kube.allocator import PluginConfig
    from gpuslice.kube.health import NvmlHealth
    from gpuslice.kube.devicestate import StaticHealth
    from gpuslice.kube.plugin import DevicePlugin
    from gpuslice.host.devices import discover, load_snapshot
    from gpuslice.spec import SpecError

    _logging(log_level)
    if not node:
        raise usage("--node (or $NODE_NAME) is required: the name of the Node this agent serves")
    # checked before any discovery or API call: a bad flag is named at once (exit 2), nothing started
    with option_values({"log_level": "--enforcer-log-level", "local_state_dir": "--state-dir",
                        "host_library": "--library"}):
        check_resource_name("--resource-name", resource_name)
        if kubeconfig:
            existing_file(kubeconfig, "--kubeconfig")
        if rediscover_interval < 0:
            raise SpecError("--rediscover-interval", rediscover_interval, "seconds, 0 (discover once) or more")
        if health_recovery < 0:
            raise SpecError("--health-recovery", health_recovery, "seconds, 0 (never recover) or more")
        cfg = PluginConfig(node=node, resource_name=resource_name, split_count=split_count,
                           memory_scaling=memory_scaling, plugin_dir=Path(plugin_dir), socket_name=socket_name,
                           host_state_dir=Path(host_state_dir),
                           local_state_dir=Path(state_dir) if state_dir else None, host_library=Path(library),
                           device_nodes=device_nodes, oom_policy=oom_policy, fail_open=fail_open,
                           log_level=enforcer_log_level, oom_wait_ms=oom_wait_ms)

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

    if dra:
        from gpuslice.kube.dra.agent import DraOptions, run

        options = DraOptions(min_memory, compute_mode, dra_plugin_dir, dra_registry_dir, cdi_dir, publish_interval,
                             rediscover_interval, health_recovery, metrics_port, register_only, snapshot is not None,
                             backstop=policy, backstop_interval=backstop_interval,
                             high_priority=tuple(n for n in high_priority_namespace if n))
        return run(cfg, options, find_devices, lambda: connect(kubeconfig), _say)
    with named_file("--snapshot", given=bool(snapshot)):
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
    if plugin.allocator is not None:  # the spatial engine's daemons: stopped when no pod needs them
        from gpuslice.kube.mpsnode import MpsNode

        MpsNode(api, node, plugin.allocator).start()
        from gpuslice.kube.resize import NodeResizer

        NodeResizer(api, node, plugin.allocator).start()  # live resize: usage check and slice file
    if rediscover_interval:
        Rediscovery(find_devices, plugin.set_devices, rediscover_interval).start()
    guard = _start_backstop(api, node, devices, policy, backstop_interval)
    if metrics_port:
        _serve_metrics(api, node, devices, cfg.local_state, metrics_port,
                       plugin.allocator.mps if plugin.allocator is not None else None, guard)
    _say(f"device plugin for {resource_name} ({len(devices)} device(s) × {split_count}) on {cfg.socket_path}")
    plugin.run()


def _start_backstop(api, node: str, devices, policy, interval: float):
    """The backstop thread (gpuslice.kube.backstop) over the node ledger, or None when it is off or NVML cannot
    count processes."""
    from gpuslice.kube.backstop import start_backstop
    from gpuslice.kube.labels import LedgerLabels

    labels = LedgerLabels(api, node, ttl=interval)
    return start_backstop(policy, interval, devices, labels.ledger,
                          lambda: api.list_pods(field_selector=f"spec.nodeName={node}"), _say)


def _serve_metrics(api, node: str, devices, state_dir: Path, port: int, mps=None, guard=None) -> None:
    """The node's slice metrics; ``mps``: the spatial slices' daemons (state, faults); ``guard``: the backstop,
    whose last findings join each view."""
    from gpuslice.kube.labels import LedgerLabels, serve_metrics, watched_grants

    labels = LedgerLabels(api, node)
    serve_metrics(devices, node, port, lambda: watched_grants(labels.ledger(), state_dir), labels, mps=mps,
                  backstop=(lambda: guard.latest) if guard is not None else None)
    _say(f"metrics on :{port}/metrics")


def kube_certs(
    directory: str = typer.Option(..., "--dir", metavar="DIR", help="Folder for ca.crt, tls.crt and tls.key."),
    hosts: List[str] = typer.Option(["localhost", "127.0.0.1"], "--host", metavar="ADDR",
                                    help="DNS names / IPs of the webhook "
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
