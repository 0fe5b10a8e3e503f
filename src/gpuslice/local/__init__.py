"""Local mode: one machine without Kubernetes — the ledger, the agent, ``gpuslice run``/``ps``/``top``.

=================  ==========================================================================================
module             owns
=================  ==========================================================================================
``paths``          the state dir and its layout
``records``        local records: ``Ask``, ``GrantRecord`` (a :class:`~gpuslice.spec.Grant` + who holds it),
                   ``Queued``, ``Waiter``
``ledger``         the SQLite ledger: grants and the wait queue, no over-commit, reclaim of dead holders
``admission``      which requests can never fit, which devices a waiter competes for
``grantfiles``     a grant's folder and slice file
``agent``          the optional daemon: the socket API, reclaimer, dashboard and metrics
``client``         the agent's socket API as Python calls; choosing agent or ledger
``launcher``       ``gpuslice run``
``commands``       the verbs ``run``, ``ps``, ``top``, ``agent``
=================  ==========================================================================================

Docs: ``src/gpuslice/local/README.md``.
"""
