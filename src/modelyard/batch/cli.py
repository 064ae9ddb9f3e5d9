"""``modelyard batch-predict``: parses the flags, runs ``batch_predict`` and prints the summary."""
from __future__ import annotations

import argparse
import sys

from modelyard.batch.api import DEFAULT_BATCH_SIZE, batch_predict
from modelyard.batch.spec import DEFAULT_CHUNK_ROWS, FORMATS, BatchError
from modelyard.cli_parser import examples


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "batch-predict",
        help="run a model over files of instances into sharded result files (Vertex AI batch prediction)",
        description=(
            "Predict every instance of the input files with a model and write "
            "OUTPUT/prediction-<model>-<timestamp>/prediction.results-0000K-of-0000N (JSON lines) and "
            "prediction.errors_stats-00000-of-00001 (rows the model refused). Running the same command "
            "again finishes an interrupted job, each row exactly once, and does nothing for a finished one; "
            "another job into the same OUTPUT gets its own folder beside it. A job in which no row "
            "succeeded fails (exit 1)."
        ),
        usage="%(prog)s --model MODEL --input FILE|GLOB --output DIR [--format FORMAT] [options]\n"
              "       %(prog)s --resume JOB_DIR [options]",
        epilog=examples(
            "modelyard batch-predict --model models/my_mnist_model --input 'data/*.jsonl' --output out/",
            "modelyard batch-predict --model models/my_mnist_model:1 --input rows.csv --output out/ --key-field id",
            "modelyard batch-predict --resume out/prediction-my_mnist_model-2026_01_01T00_00_00_000Z",
        ),
    )
    parser.add_argument("--model", help="model base path, BASE:VERSION, or a version directory")
    parser.add_argument("--input", action="append",
                        help="input file or glob (quote it): a local path, file://, gs:// or s3://; repeatable")
    parser.add_argument("--output", help="directory that receives the job's prediction-<model>-<time>/ folder (it "
                                         "may hold other jobs): local, file://, gs:// or s3:// (staged locally, "
                                         "uploaded when the job succeeds)")
    parser.add_argument("--format", default=None, choices=FORMATS,
                        help="instances format (default: from the input's extension: .csv, .jsonl/.json, "
                             ".tfrecord; else jsonl)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="rows per model call")
    parser.add_argument("--workers", type=int, default=None,
                        help="worker processes (local) or Ray actors (ray), each loading the model once "
                             "(default: this machine's cores, or the Ray cluster's CPUs; 0: in this process)")
    parser.add_argument("--engine", default="local", choices=("local", "ray"),
                        help="local (default: processes on this machine) or ray (actors on a Ray cluster)")
    parser.add_argument("--ray-address", metavar="HOST:PORT",
                        help="the Ray cluster's head node for --engine ray (default: RAY_ADDRESS, else a new "
                             "local Ray)")
    parser.add_argument("--resume", metavar="JOB_DIR", help="finish the job in JOB_DIR (a prediction-<model>-<time>/ "
                                                            "folder)")
    parser.add_argument("--key-field", help="instance field carried to the output as 'key' (not sent to the model)")
    parser.add_argument("--included-fields", help="comma-separated fields sent to the model")
    parser.add_argument("--excluded-fields", help="comma-separated fields not sent to the model")
    parser.add_argument("--instance-type", choices=("object", "array"), help="send instances as objects or arrays")
    parser.add_argument("--signature-name", default="serving_default")
    parser.add_argument("--runtime", default="auto", choices=("auto", "tensorflow", "litert"),
                        help="as the server's --runtime (default auto: LiteRT where it matches TensorFlow)")
    parser.add_argument("--json-numbers", default="tf_serving", choices=("tf_serving", "vertex"),
                        help="how JSON numbers reach integer inputs, as serve's --json_numbers: tf_serving "
                             "(default: 0.0 is refused) or vertex (integral numbers such as 0.0 are integers, as "
                             "on Vertex AI; the platform's batch jobs use it)")
    parser.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS,
                        help="rows per committed part (the unit of resume)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        job = batch_predict(
            args.model, args.input, args.output, format=args.format, batch_size=args.batch_size,
            workers=args.workers, key_field=args.key_field, included_fields=args.included_fields or (),
            excluded_fields=args.excluded_fields or (), instance_type=args.instance_type, resume=args.resume,
            signature_name=args.signature_name, runtime=args.runtime, chunk_rows=args.chunk_rows,
            engine=args.engine, ray_address=args.ray_address, progress=not args.no_progress,
            json_numbers=args.json_numbers,
        )
    except BatchError as exc:
        print(f"modelyard batch-predict: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the job's own bookkeeping (.lock, job.json, plan.json) could not be written
        print(f"modelyard batch-predict: error: cannot write the job's bookkeeping: {exc.strerror}: "
              f"{exc.filename or ''} (free space or inodes on the output's file system, then run the same "
              "command again to resume)", file=sys.stderr)
        return 1
    stats = job.completion_stats
    if job.state != "JOB_STATE_SUCCEEDED":
        print(f"modelyard batch-predict: job {job.job_dir} {job.state}: {job.error}", file=sys.stderr)
        return 1
    seconds = job.data.get("last_run_seconds")
    print(f"{job.state}: {stats['successful_count']:,} results, {stats['failed_count']:,} errors, "
          f"{stats['successful_count'] + stats['failed_count']:,} rows"
          + (f" in {seconds:.1f} s" if seconds else ""))
    print(f"output: {job.output_info.gcs_output_directory}")
    return 0
