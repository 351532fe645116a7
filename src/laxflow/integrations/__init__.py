"""The prefill-scheduler side of laxflow: prefill policies and a preemptible engine.

``laxflow.integrations.prefill`` holds pure prefill scheduling policies
(FlowPrefill and its baselines) that the serving simulator and a real engine
drive with the same objects; ``laxflow.integrations.engine`` is a small CPU
PyTorch engine with operator-level preemption (needs the ``torch`` extra).
"""
