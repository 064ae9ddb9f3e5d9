"""Model management, after TF Serving's core: version directories and policies (``versions``),
the model config and monitoring files (``config``), loading a version into a servable with
its runtime, warmup and batching (``loader``), and the manager that keeps each model's aspired
versions loaded, swaps them without dropping a request and resolves labels (``manager``).

May import: ``modelyard.model``, ``serving.batching``, ``serving.metrics``, ``serving.textproto``,
``modelyard.errors``.
"""
