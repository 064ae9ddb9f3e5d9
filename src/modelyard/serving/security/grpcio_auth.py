"""Bearer tokens on grpcio's server (``--grpc_implementation=grpcio``): a server interceptor.

The interceptor sees the method and metadata before grpcio reads the request message,
so a refused call costs no deserialization; it answers UNAUTHENTICATED or PERMISSION_DENIED.
"""
from __future__ import annotations

import grpc

from modelyard.serving.security.auth import Authorizer


class TokenInterceptor(grpc.ServerInterceptor):
    def __init__(self, authorizer: Authorizer):
        self.authorizer = authorizer

    def intercept_service(self, continuation, handler_call_details):
        authorization = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                authorization = value.encode("latin-1") if isinstance(value, str) else value
                break
        method = handler_call_details.method
        denied = self.authorizer.check(authorization, self.authorizer.grpc_scope(method))
        if denied is None:
            return continuation(handler_call_details)
        code, message = denied
        status = grpc.StatusCode[code.name]

        def refuse(_request, context):
            context.abort(status, message)

        # The request is read by grpcio, but never deserialized: the handler takes raw bytes.
        return grpc.unary_unary_rpc_method_handler(refuse)
