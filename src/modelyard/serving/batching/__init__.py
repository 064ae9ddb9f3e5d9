"""Dynamic batching: TF Serving's ``BatchingParameters`` (``config``), the per-model queues and
batch threads that merge concurrent requests into one model call (``scheduler``), and the
future each queued request waits on (``batch_future``).

May import: ``modelyard.model`` (signatures, servables), ``serving.textproto`` (the text-format
reader) and ``modelyard.errors``.
"""
