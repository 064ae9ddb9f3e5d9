"""Bytes on the wire: the HTTP/1.1 event-loop server, the lean HTTP/2 gRPC server and its
frames, the answer writer (``_sendmany.c``) and the bridge that brings a finished future
back onto an event loop.

May import: ``modelyard.errors``, ``serving.protocol`` (the apps it carries), ``serving.core``
and ``serving.batching`` (request deadlines). Holds no model logic and no protocol rules.
"""
