"""``modelyard serve``: TF Serving's command line (flags in ``options``), dispatched to ``launch``."""
from __future__ import annotations

import argparse
import logging
import sys

from modelyard.cli_parser import examples


def register(subparsers) -> None:
    from modelyard.serving.options import add_flags

    parser = subparsers.add_parser(
        "serve",
        help="serve models over TF Serving's REST (8501) and gRPC (8500) APIs",
        description="Serve SavedModels and .tflite models, wire-compatible with TensorFlow Serving. "
        "With no model named, serves the built-in digits demo model (my_mnist_model).",
        epilog=examples(
            "modelyard serve                                   # the built-in digits demo model",
            "modelyard serve --model_name my_mnist_model --model_base_path models/my_mnist_model",
            "modelyard serve --model_config_file models.config --model_config_file_poll_wait_seconds 10",
            "modelyard serve --model_base_path models/my_mnist_model --workers 2 --enable_batching",
        ),
    )
    parser.dash_spellings = True  # --model-base-path works too
    add_flags(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from modelyard.serving.launch import serve
    from modelyard.serving.options import OptionsError, resolve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        options = resolve(args)
    except OptionsError as exc:
        print(f"modelyard serve: error: {exc}", file=sys.stderr)
        return 2
    return serve(options)
