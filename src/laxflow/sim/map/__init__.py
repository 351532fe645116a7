"""``laxflow sim map``: MFS over the best baseline, and FS's CCT inflation, across a parameter grid.

``grid`` (axes, cells, each cell's deployment, a user's ``[cluster]``), ``run``
(capacities, runs through ``experiment.run_all``, resuming from ``--json``),
``figures`` (one cell's figures from its runs), ``output`` (JSON, CSV, heatmaps).
The command itself is :mod:`laxflow.sim.map_cli`.
"""
