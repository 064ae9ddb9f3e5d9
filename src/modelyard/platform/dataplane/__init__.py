"""The serving plane: the public front and gateway, routing and traffic splits, upstream
connections and deadlines, replicas (local and Ray engines), their supervisor, the
autoscaler and the gateway's metrics.

May import: ``platform.api``, ``platform.state``, ``modelyard.ports``; ``serving`` only as
``modelyard serve`` processes over HTTP."""
