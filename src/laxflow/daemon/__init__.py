"""The node daemon: one per node, schedules the node's NIC ports (MFS §5).

:mod:`.core` is the pure state machine (events and a clock in; permits,
reports, metrics out), :mod:`.gate` the permit rule, :mod:`.ports` port
discovery and load measurement, :mod:`.service` the loop around the core
(shared memory, ZeroMQ, hooks server, Prometheus), :mod:`.cli` the
``laxflow daemon`` command.
"""
