"""gpuslice as a Kubernetes DRA (Dynamic Resource Allocation, ``resource.k8s.io/v1``) driver: ``gpuslice kube-agent --dra``.

kube-scheduler's own DRA allocator places claims on the devices each node publishes; the node agent turns what it
allocated into a slice file and a CDI spec. Same enforcer, same slice file, same monitor as the device-plugin path.

============== ====================================================================================================
module         what
============== ====================================================================================================
resourceslice  the node's ResourceSlice as pure data: devices (GPUs or MIG instances), attributes, consumable
               ``memory`` / ``compute`` / ``slices`` capacities with their request policies, health taints
publisher      keeps that ResourceSlice current (create, conditioned replace with a new pool generation)
claims         an allocated ResourceClaim read for this node → the :class:`~gpuslice.spec.Grant` it amounts to
cdi            CDI spec files of prepared claims (slice file, enforcer, ``ld.so.preload`` read-only, visible GPUs)
checkpoint     the prepared claims, on disk: prepare answers the same after a restart
driver         ``NodePrepareResources`` / ``NodeUnprepareResources`` on plain data (idempotent)
plugin         the kubelet plugin: gRPC ``v1.DRAPlugin`` + plugin registration on Unix sockets
kubeletapi     the kubelet's own protos (verbatim, k8s.io/kubelet v0.37.2), compiled at build time
api            the resource.k8s.io/v1 calls
agent          the parts wired together: ``gpuslice kube-agent --dra``
============== ====================================================================================================

``src/gpuslice/kube/README.md`` ("DRA mode") has the user-facing description: what is published, how claims ask
for slices, what a container gets, how to switch from device-plugin mode.
"""
