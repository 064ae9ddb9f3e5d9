"""Training: ``modelyard train`` (config, strategies, devices, data, the trainer, train steps with
accumulation and bf16 gradients, pipeline/model parallelism, parameter-server loops with backup
workers or staleness control) and ``modelyard launch`` (the supervised cluster of processes).

May import: ``modelyard.model`` (export), ``modelyard.datasets``, ``modelyard.errors``. Never ``serving``,
``platform`` or ``tuning``: tuning runs training as processes.
"""
