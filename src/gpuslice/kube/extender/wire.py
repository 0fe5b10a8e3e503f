"""The extender's wire format: kube-scheduler's ExtenderArgs, ExtenderBindingArgs and host priorities
(``k8s.io/kube-scheduler/extender/v1``). The Go structs carry no JSON tags, so the keys are the Go field
names; decoding here is case-insensitive, like Go's. A payload of the wrong shape is :class:`BadRequest`
(HTTP 400), never a traceback."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from gpuslice.kube import podrequest
from gpuslice.spec import GpusliceError

MAX_EXTENDER_PRIORITY = 10  # k8s.io/kube-scheduler/extender/v1 MaxExtenderPriority


class BadRequest(GpusliceError):
    """The payload is not what the endpoint takes: answered with HTTP 400 and this message."""


# ---------------------------------------------------------------------------------------- payloads
def _ci(obj: Mapping[str, Any], name: str) -> Any:
    """Go's encoding/json matches keys case-insensitively; so do we."""
    if name in obj:
        return obj[name]
    low = name.lower()
    for k, v in obj.items():
        if isinstance(k, str) and k.lower() == low:
            return v
    return None


def node_shape_problem(node: Any) -> str:
    """What makes ``node`` not a Node object we can read ('' when its shape is fine): the parts the
    extender reads must have the API server's types, else the request is answered 400, not 500."""
    if not isinstance(node, dict):
        return "must be a Node object"
    meta = node.get("metadata")
    if not isinstance(meta, dict):
        return "metadata must be an object"
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return "metadata.name must be a non-empty string"
    anns = meta.get("annotations")
    if anns is not None and not isinstance(anns, dict):
        return f"metadata.annotations of node {name} must be an object of strings (got {type(anns).__name__})"
    bad = [k for k, v in (anns or {}).items() if not isinstance(v, str)]
    if bad:
        return f"metadata.annotations[{bad[0]}] of node {name} must be a string"
    rv = meta.get("resourceVersion")
    if rv is not None and not isinstance(rv, str):
        return f"metadata.resourceVersion of node {name} must be a string"
    return ""


@dataclass(frozen=True)
class ExtenderArgs:
    pod: dict[str, Any]
    nodes: list[dict[str, Any]] | None  # full Node objects (nodeCacheCapable: false)
    node_names: list[str]               # candidate names, in the scheduler's order

    @classmethod
    def parse(cls, body: Any) -> "ExtenderArgs":
        if not isinstance(body, dict):
            raise BadRequest("ExtenderArgs must be a JSON object with Pod and Nodes or NodeNames")
        pod = _ci(body, "Pod")
        if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
            raise BadRequest("ExtenderArgs.Pod must be a Pod object with metadata")
        problem = podrequest.pod_shape_problem(pod)
        if problem:
            raise BadRequest(f"ExtenderArgs.Pod.{problem}")
        nodes_doc = _ci(body, "Nodes")
        names_doc = _ci(body, "NodeNames")
        nodes = None
        if nodes_doc is not None:
            items = nodes_doc.get("items") if isinstance(nodes_doc, dict) else None
            if not isinstance(items, list):
                raise BadRequest("ExtenderArgs.Nodes must be a NodeList: {\"items\": [Node with metadata.name]}")
            for k, n in enumerate(items):
                problem = node_shape_problem(n)
                if problem:
                    raise BadRequest(f"ExtenderArgs.Nodes.items[{k}].{problem}")
            nodes = items
            names = [n["metadata"]["name"] for n in items]
        elif names_doc is not None:
            if not isinstance(names_doc, list) or not all(isinstance(n, str) for n in names_doc):
                raise BadRequest("ExtenderArgs.NodeNames must be a list of node names")
            names = list(names_doc)
        else:
            raise BadRequest("ExtenderArgs needs Nodes (a NodeList) or NodeNames (a list of names)")
        return cls(pod=pod, nodes=nodes, node_names=names)


@dataclass(frozen=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str

    @classmethod
    def parse(cls, body: Any) -> "BindingArgs":
        if not isinstance(body, dict):
            raise BadRequest("ExtenderBindingArgs must be a JSON object with PodName, PodNamespace, PodUID, Node")
        values = {}
        for key in ("PodName", "PodNamespace", "PodUID", "Node"):
            v = _ci(body, key)
            if not isinstance(v, str) or not v:
                raise BadRequest(f"ExtenderBindingArgs.{key} must be a non-empty string (got {v!r})")
            values[key] = v
        return cls(values["PodName"], values["PodNamespace"], values["PodUID"], values["Node"])


def extender_scores(scores: Mapping[str, float], names: Iterable[str]) -> list[dict[str, Any]]:
    """Placement's 0..100 node scores as kube-scheduler's 0..10 extender priorities: the placement
    core's own choice (the highest score; all of them if several tie exactly) alone gets 10, the others
    at most 9. Rounding alone would give 10 to every node within 5 points of the best, and kube-scheduler
    breaks ties at random — which undoes ``fgd``'s fixed tie order, the thing that keeps whole nodes
    free for large tasks (gpuslice.placement docs). Nodes placement did not score get 0. The best is taken
    among ``names``, the nodes kube-scheduler asks about: when placement's best node overall is not one of
    them (kube-scheduler's own filters left it out), the best of them still gets 10 rather than a tie at 9."""
    names = list(names)
    top = max((scores[n] for n in names if n in scores), default=None)
    out = []
    for n in names:
        s = scores.get(n)
        if s is None:
            points = 0
        elif s == top:
            points = MAX_EXTENDER_PRIORITY
        else:
            points = min(MAX_EXTENDER_PRIORITY - 1, int(round(s * (MAX_EXTENDER_PRIORITY - 1) / 100)))
        out.append({"Host": n, "Score": points})
    return out
