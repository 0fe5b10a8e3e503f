"""What every GPU node needs, in local mode and in Kubernetes alike.

=============  ==============================================================================================
module         owns
=============  ==============================================================================================
``devices``    device discovery through NVML, device snapshots (``snapshots/``, ``devices --json``)
``monitor``    the node view: watched grants + regions + slice records → per-slice and per-device usage
``usage``      a watched grant's live usage from its region file
``metrics``    the Prometheus exposition of a node view
``history``    a bounded history of node views (the dashboard's plots)
``tables``     ``ps``/``top`` tables of a node view
``procs``      ``/proc`` tools: start times, process groups, environments, exact signals
``commands``   the ``gpuslice devices`` verb
=============  ==============================================================================================

The monitor takes neutral :class:`~gpuslice.host.monitor.Watched` grants: local mode and Kubernetes each say
what they hold, nothing here knows a ledger. Metric names: ``src/gpuslice/host/README.md``.
"""
