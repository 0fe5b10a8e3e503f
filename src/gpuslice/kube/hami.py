"""HAMi's annotations beyond its resource names, read as HAMi (v2.10) documents them, and the MIG resource
names of NVIDIA's device plugin (``nvidia.com/mig-<profile>``, its "mixed" strategy, HAMi's
``examples/nvidia/mig_example.yaml``).

=================================  ===================================================================
``hami.io/gpu-scheduler-policy``   a comma list (HAMi reads ``binpack,numa``): at most one ordering
                                   (a placement policy: ``binpack``, ``spread``, … or HAMi's
                                   ``topology-aware``), plus ``numa`` (a grant's devices on one NUMA node
                                   where one has room, else anywhere: HAMi's NUMA sort key) and
                                   ``mutex`` (only devices nobody uses: :class:`GpuPolicy`)
``nvidia.com/vgpu-mode``           ``hami-core`` (slices of whole GPUs, never a MIG instance), ``mig``
                                   (whole MIG instances) or ``mps`` (spatial slices of whole GPUs: the
                                   pod's GPU containers get ``engine: spatial``, MPS-backed)
``nvidia.com/numa-bind``           ``true``: each container's devices on one NUMA node (a hard rule)
``hami.io/device-scoring-weights`` ``slot=1,core=1,memory=3``: binpack / spread weigh these shares
``gpuslice.io/mig-profile``        ``3g.40gb`` (every GPU container) or ``main=3g.40gb,side=1g.10gb``: whole
                                   MIG instances of that profile; the webhook writes it when it rewrites
                                   ``nvidia.com/mig-<profile>`` to the advertised count
``hami.io/device-cordon`` (Node)   read by :func:`gpuslice.kube.formats.cordoned`
=================================  ===================================================================

Every refusal is a :class:`SpecError` naming the annotation and saying what to write instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from gpuslice.kube import formats
from gpuslice.placement import POLICIES
from gpuslice.spec import SpecError

# nvidia.com/mig-1g.10gb, nvidia.com/mig-1g.10gb.me (NVIDIA's spelling of the 1g.10gb+me profile)
MIG_RESOURCE = re.compile(r"nvidia\.com/mig-(?P<profile>[0-9]+g\.[0-9]+gb(?:\.[a-z0-9]+)*)")
VGPU_MODES = ("hami-core", "mig", "mps")
GPU_POLICY_FLAGS = ("numa", "mutex")
WEIGHT_KEYS = ("slot", "core", "memory")


def field(key: str) -> str:
    return f"metadata.annotations[{key}]"


def mig_profile_of(resource: str) -> str:
    """The MIG profile a ``nvidia.com/mig-<profile>`` resource names (``1g.10gb.me`` → ``1g.10gb+me``),
    or '' when the name is not one."""
    m = MIG_RESOURCE.fullmatch(resource)
    if not m:
        return ""
    head, tail = re.fullmatch(r"([0-9]+g\.[0-9]+gb)(.*)", m.group("profile")).groups()  # type: ignore[union-attr]
    return head + tail.replace(".", "+")


@dataclass(frozen=True)
class GpuPolicy:
    """``hami.io/gpu-scheduler-policy`` read as HAMi's comma list."""

    order: str | None  # the GPU-level placement policy (None: the cluster's)
    mutex: bool = False  # place only on devices nobody uses (others may share them afterwards, as in HAMi)
    numa: bool = False  # HAMi's NUMA sort key: a multi-device grant on one NUMA node where one has room


def gpu_policy(value: Any, key: str = formats.HAMI_GPU_POLICY) -> GpuPolicy:
    """Parse a GPU policy list: ``binpack``, ``spread,numa``, ``mutex``, ``binpack,mutex``, ``topology-aware``."""
    allowed = ("a comma list of at most one of " + ", ".join(POLICIES) + " with numa and/or mutex "
               "(e.g. binpack,numa); topology-aware may join binpack or spread")
    text = value.strip().lower() if isinstance(value, str) else ""
    tokens = [t.strip() for t in text.split(",")]
    if not text or any(not t for t in tokens) or any(t not in POLICIES and t not in GPU_POLICY_FLAGS for t in tokens):
        raise SpecError(field(key), value, allowed)
    orders = [t for t in dict.fromkeys(tokens) if t in POLICIES]
    plain = [t for t in orders if t != "topology-aware"]
    if len(plain) > 1:
        raise SpecError(field(key), value, allowed)
    # topology-aware beside binpack / spread: that order ranks devices, and the best-connected set for
    # several devices (what topology-aware adds in HAMi's Fit) is gpuslice's topology pick, always on.
    order = plain[0] if plain else (orders[0] if orders else None)
    return GpuPolicy(order=order, mutex="mutex" in tokens, numa="numa" in tokens)


def vgpu_mode(anns: Mapping[str, str]) -> str:
    """``nvidia.com/vgpu-mode``: '' (not given: any device, MIG instances included, as HAMi), ``hami-core``,
    ``mig`` or ``mps`` (HAMi's MPS mode: gpuslice's spatial engine on whole GPUs)."""
    key = formats.HAMI_VGPU_MODE
    if key not in anns:
        return ""
    text = str(anns[key]).strip().lower()
    if text not in VGPU_MODES:
        raise SpecError(field(key), anns[key], "hami-core, mig or mps (HAMi's modes gpuslice serves)")
    return text


def numa_bind(anns: Mapping[str, str]) -> bool:
    """``nvidia.com/numa-bind``: ``true`` or ``false`` (any case)."""
    key = formats.HAMI_NUMA_BIND
    if key not in anns:
        return False
    text = str(anns[key]).strip().lower()
    if text not in ("true", "false"):
        raise SpecError(field(key), anns[key], "true or false")
    return text == "true"


def scoring_weights(anns: Mapping[str, str]) -> tuple[int, int, int] | None:
    """``hami.io/device-scoring-weights``: ``slot=1,core=1,memory=3`` → (1, 1, 3); None when absent. As
    HAMi: all three keys, each once, whole numbers ≥ 0, at least one above 0."""
    key = formats.HAMI_SCORING_WEIGHTS
    if key not in anns:
        return None
    allowed = "slot=<n>,core=<n>,memory=<n>: each key once, whole numbers from 0 to 1000, at least one above 0"
    found: dict[str, int] = {}
    for part in str(anns[key]).split(","):
        name, sep, number = part.partition("=")
        name, number = name.strip().lower(), number.strip()
        if not sep or name not in WEIGHT_KEYS or name in found or not number.isdigit() or int(number) > 1000:
            raise SpecError(field(key), anns[key], allowed)
        found[name] = int(number)
    if set(found) != set(WEIGHT_KEYS) or not any(found.values()):
        raise SpecError(field(key), anns[key], allowed)
    return (found["slot"], found["core"], found["memory"])


_PROFILE = re.compile(r"[0-9]+g\.[0-9]+gb(?:\+[a-z0-9]+)*")


def mig_profiles(anns: Mapping[str, str]) -> dict[str, str]:
    """``gpuslice.io/mig-profile``: ``{"": profile}`` for every GPU container, or ``{container: profile}``."""
    key = formats.POD_MIG_PROFILE
    if key not in anns:
        return {}
    allowed = "a MIG profile like 3g.40gb, or container=profile pairs separated by commas"
    text = str(anns[key]).strip()
    if _PROFILE.fullmatch(text):
        return {"": text}
    out: dict[str, str] = {}
    for part in text.split(","):
        name, sep, profile = (x.strip() for x in part.partition("="))
        if not sep or not name or name in out or not _PROFILE.fullmatch(profile):
            raise SpecError(field(key), anns[key], allowed)
        out[name] = profile
    return out


def encode_mig_profiles(profiles: Mapping[str, str]) -> str:
    return ",".join(f"{name}={profile}" for name, profile in sorted(profiles.items()))


__all__ = ["GpuPolicy", "MIG_RESOURCE", "VGPU_MODES", "encode_mig_profiles", "field", "gpu_policy",
           "mig_profile_of", "mig_profiles", "numa_bind", "scoring_weights", "vgpu_mode"]
