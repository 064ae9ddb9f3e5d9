"""``modelyard convert``: SavedModel or Keras model -> TFLite, with a cost report.

Parses arguments and calls ``modelyard.edge.pipeline``; writes output only after the
conversion and its checks succeeded.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from modelyard.edge.modes import IO_DTYPES, MODES, ConvertOptions

EPILOG = """examples:
  modelyard convert models/my_mnist_model -o mnist.tflite --quantize dynamic
  modelyard convert models/my_mnist_model:1 --into models/my_mnist_lite --quantize int8 \\
      --representative-data digits --io-dtype uint8
  modelyard convert models/my_mnist_model --compare --representative-data digits
  modelyard convert models/my_mnist_model --to web -o site/ && modelyard web site/
  modelyard convert classifier.keras --to web -o site/ --scale 1 --labels labels.txt   # an RGB model, 0..1 inputs
  modelyard convert model.keras --qat --epochs 1 --representative-data train.npz -o model.tflite
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "convert",
        help="convert a SavedModel or Keras model to TFLite (quantization, QAT, size/latency/accuracy report)",
        description="Convert SRC to TFLite and report size, LiteRT latency and agreement with the original. "
        "SRC is a SavedModel directory, a model base path (latest version), BASE:VERSION, or a .keras/.h5 file.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("src", metavar="SRC")
    where = p.add_mutually_exclusive_group()
    where.add_argument("-o", "--output", metavar="OUT.tflite", help="write the flatbuffer here (with --to web: the site folder)")
    where.add_argument("--into", metavar="BASE", help="write BASE/<next version>/model.tflite (servable by modelyard serve)")
    p.add_argument("--to", choices=("tflite", "web"), default="tflite",
                   help="web: write an installable, offline web app: the model (batch fixed to 1), LiteRT.js from npm "
                   "and a page that classifies a picture (or a drawing, for a small grey input)")
    p.add_argument("--quantize", choices=MODES, default="none")
    p.add_argument("--representative-data", metavar="FILE", help=".npz of typical inputs (int8 calibration, QAT training data), or 'digits'")
    p.add_argument("--eval-data", metavar="FILE", help=".npz of held-out inputs (+ 'labels') for the report (default: digits test split with 'digits', else random inputs)")
    p.add_argument("--io-dtype", choices=IO_DTYPES, default=None,
                   help="dtype of the float inputs/outputs of an int8 model (default float32; "
                   "uint8 for the int8 row of --compare); integer inputs such as uint8 pixels keep their dtype")
    p.add_argument("--allow-tf-ops", action="store_true", help="embed ops missing from the builtin TFLite set as TF (Flex) ops")
    p.add_argument("--signature", default="serving_default", help="signature of the SavedModel to convert")
    p.add_argument("--compare", action="store_true", help="convert in every mode and print one table; writes nothing")
    p.add_argument("--qat", action="store_true", help="quantization-aware fine-tuning of a Keras model, then int8")
    p.add_argument("--epochs", type=int, default=1, help="QAT fine-tuning epochs (default 1)")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE",
                   help="the report as JSON: alone, printed instead of the table; with FILE, written there too")
    p.add_argument("--no-report", action="store_true", help="skip measuring (faster)")
    web = p.add_argument_group("the web page's preprocessing (--to web; read from the model's input when not given)")
    web.add_argument("--resize", choices=("crop", "pad", "stretch"), default=None,
                     help="how a picture of another aspect becomes the input's HxW (default crop: the centre)")
    web.add_argument("--channels", type=int, choices=(1, 3), default=None,
                     help="1: feed grey (also to an RGB model); default: the input's channels")
    web.add_argument("--scale", metavar="HI|LO,HI", default=None,
                     help="the model's value for a black and a white pixel (default 0,255: raw pixels; 1 for 0..1; "
                     "--scale=-1,1 with '=' for a negative LO)")
    web.add_argument("--invert", action="store_true", help="dark-on-light pictures (a digit on paper) fed light-on-dark")
    web.add_argument("--labels", metavar="labels.txt", default=None, help="class names, one a line, shown instead of indexes")
    p.set_defaults(func=run)


def _print_reports(reports, json_target: str | None) -> None:
    from modelyard.edge.report import format_table, to_json

    if json_target == "-":
        print(to_json(reports))
        return
    print(format_table(reports))
    if json_target:
        Path(json_target).write_text(to_json(reports) + "\n")


def _quiet_tensorflow() -> None:
    import logging

    import tensorflow as tf

    tf.get_logger().setLevel(logging.ERROR)  # deprecation notices of the TF1 session path


def _write(content: bytes, args) -> Path:
    from modelyard.edge.source import write_tflite_file, write_tflite_version

    if args.to == "web":
        from modelyard.edge.fixed_shape import fix_batch_size
        from modelyard.web.preprocess import PreprocessFlags
        from modelyard.web.site import write_site

        flags = PreprocessFlags(args.resize, args.channels, args.scale, args.invert,
                                Path(args.labels) if args.labels else None)

        name = Path(args.src.rpartition(":")[0] if args.src.rpartition(":")[2].isdigit() else args.src)
        name = name.parent if name.name.isdigit() else name  # a version dir: its model's name
        return write_site(fix_batch_size(content), Path(args.output), quantize="qat-int8" if args.qat else args.quantize,
                          source=args.src, model_name=name.stem, flags=flags, log=lambda m: print(m, file=sys.stderr))
    if args.into:
        return write_tflite_version(content, Path(args.into))
    return write_tflite_file(content, Path(args.output))


def run(args) -> int:
    usage = None
    if args.to == "web" and not args.output:
        usage = "--to web writes a folder: give -o SITE_DIR"
    elif not (args.compare or args.output or args.into):
        usage = "give -o OUT.tflite, --into BASE, or --compare"
    elif args.compare and (args.output or args.into or args.qat):
        usage = "--compare only measures: it takes no -o, --into or --qat"
    elif args.qat and args.quantize not in ("none", "int8"):
        usage = "--qat always ends in int8; drop --quantize"
    elif args.to != "web" and (args.resize or args.channels or args.scale or args.invert or args.labels):
        usage = "--resize, --channels, --scale, --invert and --labels are for --to web"
    if usage:
        print(f"modelyard convert: error: {usage}", file=sys.stderr)
        return 2
    from modelyard.model.tflite import ConvertError  # loads TensorFlow: not at parser-building time

    try:
        from modelyard.edge import pipeline

        _quiet_tensorflow()
        io_dtype = args.io_dtype or "float32"
        options = ConvertOptions(args.quantize, io_dtype, args.allow_tf_ops)
        if not args.compare and not args.qat:
            options.check(args.representative_data is not None)  # fail before loading anything
        prepared = pipeline.prepare(
            args.src, args.representative_data, args.eval_data, args.signature,
            with_report=args.compare or not args.no_report,
        )
        if args.compare:
            reports = pipeline.compare(prepared, io_dtype=args.io_dtype or "uint8", allow_tf_ops=args.allow_tf_ops)
            _print_reports(reports, args.json)
            return 0
        if args.qat:
            options = ConvertOptions("int8", io_dtype)
            _, content = pipeline.qat_convert(prepared, args.epochs, io_dtype)
        else:
            content = prepared.convert(options)
        report = None
        if not args.no_report:
            try:
                report = prepared.measure(content, options)
                report.mode = "qat-int8" if args.qat else report.mode
            except pipeline.NotMeasurable as exc:
                print(f"modelyard convert: warning: {exc}", file=sys.stderr)
    except ConvertError as exc:
        print(f"modelyard convert: error: {exc}", file=sys.stderr)
        return 1
    try:
        target = _write(content, args)
    except ConvertError as exc:
        print(f"modelyard convert: error: {exc}", file=sys.stderr)
        return 1
    if report is not None:
        _print_reports([report], args.json)
    print(f"wrote {target} ({_written_size(target)})", file=sys.stderr)
    if args.to == "web":
        from modelyard.web.site import summary

        print(summary(target), file=sys.stderr)
    return 0


def _written_size(target: Path) -> str:
    """What was written, in bytes: a file's size, or a site folder's total (the page, the runtime and the model)."""
    if not target.is_dir():
        return f"{target.stat().st_size:,} bytes"
    files = [p for p in target.rglob("*") if p.is_file()]
    model = sum(p.stat().st_size for p in files if p.suffix == ".tflite")
    return (f"{sum(p.stat().st_size for p in files):,} bytes in {len(files)} files, of which the model "
            f"{model:,} bytes")
