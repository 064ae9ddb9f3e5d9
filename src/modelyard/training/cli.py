"""``modelyard launch`` and ``modelyard train``: argument parsing, errors as short messages."""
from __future__ import annotations

import argparse
import sys

from modelyard.cli_parser import examples
from modelyard.training.cluster import ClusterError


def register(subparsers: argparse._SubParsersAction) -> None:
    train = subparsers.add_parser(
        "train", help="train a Keras model from a YAML config (any tf.distribute strategy)",
        description="Train the model a YAML config names, with the configured tf.distribute strategy. "
                    "Run under `modelyard launch` for multi-worker strategies.",
        epilog=examples("modelyard train job.yaml",
                        "modelyard train job.yaml --epochs 2 --export-to models/my_mnist_model",
                        "modelyard launch --workers 2 -- modelyard train job.yaml   # multi_worker_mirrored"),
    )
    train.add_argument("config", metavar="CONFIG", help="YAML training config")
    train.add_argument("--job-dir", help="override job_dir from the config")
    train.add_argument("--export-to", help="override export_to (model base path) from the config")
    train.add_argument("--epochs", type=int, help="override epochs")
    train.add_argument("--fresh", action="store_true", help="delete the job dir first instead of resuming from it")
    train.set_defaults(func=run_train)

    launch = subparsers.add_parser(
        "launch", help="run a command as a supervised local cluster (chief, workers, ps, evaluator)",
        description="Start one process per task with its TF_CONFIG on free loopback ports, stream their output "
                    "prefixed with the task, stop everything if one task fails (or restart with --max-restarts).",
        epilog=examples("modelyard launch --workers 2 -- modelyard train job.yaml",
                        "modelyard launch --workers 2 --ps 1 -- modelyard train ps_job.yaml   # parameter servers"),
    )
    launch.add_argument("--chief", action="store_true", help="add a chief task")
    launch.add_argument("--workers", type=int, default=0, help="number of worker tasks")
    launch.add_argument("--ps", type=int, default=0, help="number of parameter-server tasks (adds a chief)")
    launch.add_argument("--evaluator", action="store_true", help="add a side-car evaluator task")
    launch.add_argument("--max-restarts", type=int, default=0, help="restart the whole job up to K times on failure")
    launch.add_argument("--cluster-spec", help="TF cluster JSON file, for a job spread over several hosts")
    launch.add_argument("--task", help="with --cluster-spec: the task to run on this host, e.g. worker:1")
    launch.add_argument("--print-tf-config", action="store_true", help="print each task's TF_CONFIG and exit")
    launch.add_argument("--grace", type=float, default=5.0, help="seconds to wait after SIGTERM before SIGKILL")
    launch.add_argument("--cold", action="store_true",
                        help="start every task in a fresh Python (by default TensorFlow Python commands are "
                             "forked from one interpreter that imported TensorFlow once)")
    launch.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="command each task runs")
    launch.set_defaults(func=run_launch)


def _error(command: str, message: str) -> int:
    print(f"modelyard {command}: error: {message}", file=sys.stderr)
    return 2


def run_train(args: argparse.Namespace) -> int:
    from modelyard.training.config import ConfigError, load

    overrides = {k: v for k, v in (("job_dir", args.job_dir), ("export_to", args.export_to),
                                   ("epochs", args.epochs)) if v is not None}
    try:
        cfg = load(args.config, overrides)
    except ConfigError as exc:
        return _error("train", str(exc))
    from modelyard.training import trainer

    if args.fresh:
        trainer.clean_job_dir(cfg.job_dir)
    try:
        trainer.run(cfg)
    except (ConfigError, trainer.TrainError) as exc:
        return _error("train", str(exc))
    except ValueError as exc:  # device/strategy/data errors: all carry a what-to-do message
        return _error("train", str(exc))
    return 0


def run_launch(args: argparse.Namespace) -> int:
    from modelyard.training import launcher

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    try:
        return launcher.main(
            cmd, chief=args.chief, workers=args.workers, ps=args.ps, evaluator=args.evaluator,
            max_restarts=args.max_restarts, cluster_spec=args.cluster_spec, task=args.task,
            print_tf_config=args.print_tf_config, grace=args.grace, cold=args.cold,
        )
    except (ClusterError, launcher.LaunchError) as exc:
        return _error("launch", str(exc))
