"""The model server: TF Serving's REST and gRPC APIs over modelyard's model manager.

Layers, from the bottom (``modelyard.model`` below them all: servables, runtimes, signatures):
``manager/`` (versions, states, labels, loading) and ``batching/`` -> ``core`` (predict/
classify/regress/metadata/status, no I/O) -> ``protocol/`` (REST and gRPC adapters) ->
``transport/`` (sockets, HTTP/1.1 and HTTP/2) -> ``server`` (wires them for one process),
``workers`` (several processes), ``options`` and ``cli`` (flags). ``metrics`` and ``textproto``
are leaves any of them may use. See docs/architecture.md.

May import: ``modelyard.model``, ``modelyard.errors``, ``modelyard.demo`` (the built-in model).
Never ``edge`` or ``training``.
"""
