"""Everything that crosses a process boundary in laxflow.

``laxflow.protocol.shm`` is the node-local shared-memory protocol between the
native shim (``native/``) and the node daemon: its layout is defined once, in
``native/laxflow_shm.h``, and reached from Python through the cffi module
``laxflow.protocol._shm`` built from that header.
"""
