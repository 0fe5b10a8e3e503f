"""``gpuslice kube-agent --dra``: the node agent as a DRA driver.

One process per GPU node, wiring the parts together: the device list and health
(:class:`gpuslice.kube.devicestate.DeviceTracker`, with :class:`~gpuslice.kube.health.NvmlHealth` and
:class:`~gpuslice.kube.agent.Rediscovery` as in device-plugin mode), the ResourceSlice
(:class:`.publisher.SlicePublisher`, woken by every change), and the kubelet plugin (:class:`.plugin.DraPlugin`
over :class:`.driver.DraDriver`).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from gpuslice.host.backstop import Policy
from gpuslice.kube.agent import Rediscovery
from gpuslice.kube.backstop import start_backstop
from gpuslice.kube.devicestate import DeviceTracker, HealthSource
from gpuslice.host.usage import Watched
from gpuslice.kube.allocator import PluginConfig
from gpuslice.kube.api import ClientAPI
from gpuslice.kube.dra.api import ClientDraAPI, DraAPI
from gpuslice.kube.dra.backstop import claim_containers, claim_tracked
from gpuslice.kube.dra.checkpoint import Checkpoint
from gpuslice.kube.dra.driver import CDI_DIR, PLUGIN_DIR, REGISTRY_DIR, DraConfig, DraDriver
from gpuslice.kube.dra.plugin import DraPlugin
from gpuslice.kube.dra.publisher import SlicePublisher
from gpuslice.kube.dra.resourceslice import DRIVER, Sharing
from gpuslice.kube.health import NvmlHealth
from gpuslice.kube.labels import KubeLabels, serve_metrics
from gpuslice.kube.resources import HighPriorityNamespaces
from gpuslice.kube.devicestate import StaticHealth
from gpuslice.spec import ComputeMode, Device, MiB, SpecError, parse_bytes


@dataclass
class DraAgent:
    tracker: DeviceTracker
    publisher: SlicePublisher
    driver: DraDriver
    plugin: DraPlugin
    rediscovery: Rediscovery | None = None

    def start(self) -> None:
        """Everything in threads: health, publication, rediscovery and the gRPC server."""
        self.tracker.start_health()
        self.publisher.start()
        if self.rediscovery is not None:
            self.rediscovery.start()
        self.plugin.start()

    def stop(self) -> None:
        self.plugin.stop()
        self.publisher.stop()
        self.tracker.stop()
        if self.rediscovery is not None:
            self.rediscovery.stop()


def build(api: DraAPI, cfg: DraConfig, devices: Sequence[Device], *, health: HealthSource | None = None,
          discover: Callable[[], Sequence[Device]] | None = None, rediscover_interval: float = 0.0,
          publish_interval: float = 30.0) -> DraAgent:
    """The agent's parts, not started (tests start what they need)."""
    publisher = SlicePublisher(api, cfg.node, devices, cfg.sharing, interval=publish_interval)
    tracker = DeviceTracker(devices, health=health, on_health=publisher.health_changed,
                            on_devices=publisher.devices_changed)
    driver = DraDriver(api, cfg, tracker.devices)
    rediscovery = Rediscovery(discover, tracker.set_devices, rediscover_interval) \
        if discover is not None and rediscover_interval > 0 else None
    return DraAgent(tracker, publisher, driver, DraPlugin(driver), rediscovery)


def watched_claims(checkpoint: Checkpoint, state_dir: Path) -> list[Watched]:
    """The prepared claims as the node monitor watches them (``Monitor.sample``): regions where the CDI spec
    mounts them from, owners ``<namespace>/<pods>/<claim>``."""
    return [Watched(grant=c.grant, owner=f"{c.namespace}/{','.join(c.pods)}/{c.name}",
                    region_file=str(state_dir / "kube" / "regions" / c.grant.grant_id / "region"),
                    created=c.prepared_at, command=f"claim {c.namespace}/{c.name}")
            for c in checkpoint.claims().values()]


def claim_labels(checkpoint: Checkpoint) -> Callable[[str], KubeLabels | None]:
    """``resolver(grant_id)`` for :class:`gpuslice.kube.labels.KubeLabelCollector`: namespace, the claim's pods
    (comma-separated) and, as ``container``, the claim's name (a claim is not one container's)."""
    def resolve(grant_id: str) -> KubeLabels | None:
        for c in checkpoint.claims().values():
            if c.grant.grant_id == grant_id:
                return KubeLabels(c.namespace, ",".join(c.pods), c.name)
        return None
    return resolve


@dataclass(frozen=True)
class DraOptions:
    """The ``kube-agent`` flags that only ``--dra`` reads (the shared ones are in the device plugin's config)."""

    min_memory: str = "1Gi"
    compute_mode: str = "hard"
    plugin_dir: str = str(PLUGIN_DIR)
    registry_dir: str = str(REGISTRY_DIR)
    cdi_dir: str = str(CDI_DIR)
    publish_interval: float = 30.0
    rediscover_interval: float = 60.0
    health_recovery: float = 300.0
    metrics_port: int = 0
    register_only: bool = False
    static_health: bool = False
    backstop: Policy = field(default_factory=lambda: Policy(action="off"))  # NVML held to each claim's limit
    backstop_interval: float = 2.0
    high_priority: tuple[str, ...] = ("*",)  # namespaces whose claims may be high priority (HighPriorityNamespaces)


def config(files: PluginConfig, options: DraOptions) -> DraConfig:
    """The DRA configuration from the agent's flags; a bad value is refused naming its flag."""
    try:
        min_memory = parse_bytes(options.min_memory, "--min-memory", bare_unit=MiB)
        sharing = Sharing(files.split_count, files.memory_scaling, min_memory)
        high_priority = HighPriorityNamespaces(tuple(options.high_priority))
    except SpecError as exc:
        flags = {"min_memory": "--min-memory", "split_count": "--split-count", "memory_scaling": "--memory-scaling",
                 "high_priority_namespaces": "--high-priority-namespace"}
        raise SpecError(flags.get(exc.field, exc.field), exc.value, exc.allowed) from None
    return DraConfig(node=files.node, sharing=sharing, files=files, plugin_dir=Path(options.plugin_dir),
                     registry_dir=Path(options.registry_dir), cdi_dir=Path(options.cdi_dir),
                     default_mode=ComputeMode.parse(options.compute_mode, "--compute-mode"),
                     watch_interval=files.watch_interval, high_priority=high_priority)


def run(files: PluginConfig, options: DraOptions, discover: Callable[[], Sequence[Device]],
        connect: Callable[[], ClientAPI], say: Callable[[str], None]) -> None:
    """``gpuslice kube-agent --dra``: check every flag, discover, publish, serve until killed."""
    cfg = config(files, options)
    devices = list(discover())
    api = ClientDraAPI(connect())
    if options.register_only:
        publisher = SlicePublisher(api, cfg.node, devices, cfg.sharing)
        publisher.publish()
        say(f"published ResourceSlice {publisher.node}-{DRIVER} with {len(devices)} device(s)")
        return
    health = StaticHealth() if options.static_health or os.environ.get("GPUSLICE_DEVICE_SNAPSHOT") \
        else NvmlHealth(recover_seconds=options.health_recovery)
    agent = build(api, cfg, devices, health=health, discover=discover,
                  rediscover_interval=options.rediscover_interval, publish_interval=options.publish_interval)
    guard = start_backstop(options.backstop, options.backstop_interval, devices, agent.driver.checkpoint.claims,
                           lambda: api.list_pods(f"spec.nodeName={cfg.node}"), say,
                           tracked_of=claim_tracked, containers_of=claim_containers)
    if options.metrics_port:
        serve_metrics(devices, cfg.node, options.metrics_port,
                      lambda: watched_claims(agent.driver.checkpoint, cfg.file_config.local_state),
                      claim_labels(agent.driver.checkpoint), backstop=(lambda: guard.latest) if guard else None)
        say(f"metrics on :{options.metrics_port}/metrics")
    agent.tracker.start_health()
    agent.publisher.start()
    if agent.rediscovery is not None:
        agent.rediscovery.start()
    say(f"DRA driver {DRIVER} for {len(devices)} device(s) on {cfg.socket_path} (registration "
        f"{cfg.registration_path}; CDI specs in {cfg.cdi_dir})")
    # SIGTERM (a DaemonSet update, `kubectl delete pod`): leave cleanly, taking the sockets away so the kubelet
    # sees the plugin go; the ResourceSlice, the checkpoint and prepared claims' files stay for the next start.
    signal.signal(signal.SIGTERM, lambda *_: agent.plugin.stop())
    agent.plugin.run()
