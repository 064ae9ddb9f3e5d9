"""The model server: TF Serving's REST and gRPC APIs over modelyard's model manager.

Layers, from the bottom: servables (one loaded version) -> manager (versions, states,
labels) fed by sources (polled base paths) -> core (predict/classify/regress/metadata/
status, no I/O) -> thin protocol adapters (rest, grpc_api).
"""
