"""Start serving as resolved options say: the built-in demo model when none is named, then one
server process, or several supervised worker processes sharing the ports."""
from __future__ import annotations

import sys

from modelyard.serving.options import ServeOptions


def serve(options: ServeOptions) -> int:
    """Serve until stopped; the exit status (1 when the server cannot start)."""
    from modelyard import _deferred_tf

    # TF Serving's API needs TensorFlow's messages, not TensorFlow: a model whose LiteRT conversion
    # is cached then starts in about a second, and TensorFlow loads only if something needs it.
    _deferred_tf.defer()
    if options.use_demo:
        from modelyard import demo

        options.model_base_path = demo.ensure_demo_model(log=lambda m: print(m, file=sys.stderr))
        print(f"Serving the demo model {options.model_name} from {options.model_base_path}", file=sys.stderr)

    def announce() -> None:
        if options.use_demo and options.rest_api_port:
            from modelyard import demo

            print("Try it:\n  " + demo.demo_curl_command(options.rest_api_port, options.model_name), file=sys.stderr)

    if options.workers > 1:
        from modelyard.serving.workers import run_supervised

        return run_supervised(options, options.workers, on_ready=announce)
    from modelyard.errors import ServingError
    from modelyard.ports import exit_status
    from modelyard.serving.server import ModelServer

    server = ModelServer(options)
    try:
        server.start()
    except (ServingError, OSError) as exc:
        print(f"modelyard serve: error: {getattr(exc, 'message', exc)}", file=sys.stderr)
        server.stop()
        return exit_status(exc)
    announce()
    server.serve_rest_forever()
    return 0
