"""The cluster coordinator (MFS §5, Appendix B): RED order and pruning across requests.

``core`` is the pure state machine, ``server`` the ZeroMQ process around it,
``client`` what daemons and ``laxflow status`` connect with, ``keys`` the
CURVE key files, ``cli`` the ``laxflow coordinator`` and ``laxflow keys``
commands.
"""
