"""Trace simulator: replays a cluster trace (Alibaba's openb) through :mod:`gpuslice.placement`.

``trace`` reads the CSVs and maps tasks to requests, ``engine`` runs the workload-inflation replay (the
FGD paper's method) and the time-ordered replay, ``runner`` fans replays out over processes, ``report``
writes the table, CSVs and the HTML report, ``commands`` adds ``gpuslice simulate``, ``demo`` is the
no-GPU path of ``gpuslice demo``. See ``README.md`` here.
"""
