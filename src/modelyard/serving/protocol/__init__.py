"""TF Serving's two APIs as thin adapters: REST (``rest``, its JSON bodies in ``rest_json`` and
the C reader ``_numjson.c``) and gRPC (``grpc_api``; PredictResponse bytes in ``predict_response``;
TensorProto conversion is ``model.tensor_proto``, shared with warmup). Each parses, calls ``serving.core``, encodes.

May import: ``serving.core``, ``serving.batching`` (deadlines), ``modelyard.model`` (signature
constants, dtypes, Example merging) and ``modelyard.errors``. Never ``serving.transport``.
"""
