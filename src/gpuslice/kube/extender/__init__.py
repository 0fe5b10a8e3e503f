"""The scheduler extender: kube-scheduler's ``filter``, ``prioritize`` and ``bind`` over the placement core.

Wire format (``k8s.io/kube-scheduler/extender/v1``; the Go structs carry no JSON tags, so the keys are
the Go field names — decoding here is case-insensitive, like Go's):

* ``POST /filter``      ExtenderArgs ``{"Pod": {...}, "Nodes": {"items": [...]}}`` or ``{"Pod", "NodeNames"}``
                        -> ExtenderFilterResult ``{"Nodes"|"NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}``
* ``POST /prioritize``  ExtenderArgs -> HostPriorityList ``[{"Host": "n1", "Score": 0..10}]``
* ``POST /bind``        ExtenderBindingArgs ``{"PodName", "PodNamespace", "PodUID", "Node"}`` -> ``{"Error": ""}``

State lives in the API server, never only here: a node's grants are the ``gpuslice.io/ledger``
annotation on the Node, changed by ``bind`` only through a merge patch that carries the node's
resourceVersion. Two binds racing for the same node (threads, replicas, or a restarted extender) cannot
both commit: the loser gets 409, re-reads, and places again on what is really left. After the ledger
commit, bind writes the pod's ``gpuslice.io/grant`` (UID precondition) and POSTs the binding subresource;
if either fails the ledger entry is taken back. Entries whose pod is gone, finished, bound elsewhere, or
still unbound long after its bind (a crash between commit and binding) are collected by
:meth:`Extender.collect_garbage`.

=========  =========================================================================================
module     owns
=========  =========================================================================================
``wire``   the kube-scheduler extender payloads, parsed strictly; priorities on the 0..10 scale
``cache``  node views (devices + ledger as placement state), the watch-fed cache, the shared fleet
``core``   ``Extender``: filter and prioritize over the placement core
``bind``   the bind transaction (ledger commit with the allocation lock, pod grant, binding, undo)
``gc``     garbage collection of ledger entries and allocation-lock holders
=========  =========================================================================================
"""

from gpuslice.kube.extender.cache import FleetIndex, NodeCache, NodeView, ViewCache, sum_grants, view_of
from gpuslice.kube.extender.core import Extender
from gpuslice.kube.extender.wire import (
    MAX_EXTENDER_PRIORITY, BadRequest, BindingArgs, ExtenderArgs, extender_scores, node_shape_problem,
)

__all__ = ["MAX_EXTENDER_PRIORITY", "BadRequest", "BindingArgs", "Extender", "ExtenderArgs", "FleetIndex",
           "NodeCache", "NodeView", "ViewCache", "extender_scores", "node_shape_problem", "sum_grants", "view_of"]
