"""Making the server safe to expose: TLS, bearer tokens, connection and request limits.

Pure policy, no sockets: ``tls`` builds SSL contexts from TF Serving's SSLConfig,
``auth`` decides who may call what, ``limits`` holds the numbers, ``options`` their flags.
The transports apply them (``transport/secure_http.py``, ``transport/secure_h2.py``) only
when a flag turns them on, so a server without them runs the unguarded classes.

May import: ``modelyard.serving.textproto``, ``modelyard.errors``. Never a transport or protocol
module: they import this.
"""
