"""``modelyard serve``: TF Serving's command line, plus a built-in demo model when none is named."""
from __future__ import annotations

import argparse
import logging
import sys


def register(subparsers) -> None:
    from modelyard.serving.options import add_flags

    parser = subparsers.add_parser(
        "serve",
        help="serve models over TF Serving's REST (8501) and gRPC (8500) APIs",
        description="Serve SavedModels and .tflite models, wire-compatible with TensorFlow Serving. "
        "With no model named, serves the built-in digits demo model (my_mnist_model).",
    )
    add_flags(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from modelyard.serving.options import OptionsError, resolve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        options = resolve(args)
    except OptionsError as exc:
        print(f"modelyard serve: error: {exc}", file=sys.stderr)
        return 2
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
    from modelyard.serving.server import ModelServer

    server = ModelServer(options)
    try:
        server.start()
    except (ServingError, OSError) as exc:
        print(f"modelyard serve: error: {getattr(exc, 'message', exc)}", file=sys.stderr)
        server.stop()
        return 1
    announce()
    server.serve_rest_forever()
    return 0
