"""``modelyard tune STUDY`` and ``modelyard tune status STUDY``: argument parsing, errors as short messages."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from modelyard.cli_parser import examples


USAGE = ("modelyard tune STUDY [--max-trials N] [--parallel N] [--restart] [options]\n"
         "       modelyard tune status STUDY [--plots DIR]")
EPILOG = examples(
    "modelyard tune study.yaml                          # run the study; run it again to resume",
    "modelyard tune study.yaml --max-trials 4 --parallel 2",
    "modelyard tune study.yaml --restart                # archive the old study and its runs/, start over",
    "modelyard tune status study.yaml                   # the trials table, from the study's database",
    "modelyard tune study.yaml --export-best-to models/mnist --plots plots/",
    "modelyard tune study.yaml --experiment my-study  # each trial a run of a Vertex experiment on $MODELYARD_PLATFORM",
)


def register(subparsers: argparse._SubParsersAction) -> None:
    tune = subparsers.add_parser(
        "tune", help="tune hyperparameters: run a study's trials in parallel, one per device",
        usage=USAGE, epilog=EPILOG,
        description="Run the study a YAML file describes (Vertex AI StudySpec): trials are runs of the training "
                    "command with the trial's hyperparameters as --name=value flags, one per device slot, "
                    "stopped early by the study's stopping rule. Run it again to resume. "
                    "`modelyard tune status STUDY` prints the trials.",
    )
    # `status` is an optional word before the one study file: `tune STUDY` or `tune status STUDY`.
    tune.add_argument("status", nargs="?", choices=["status"], metavar="status",
                      help="show the study's trials instead of running it")
    tune.add_argument("study", metavar="STUDY", help="the study file (YAML, or a Vertex HyperparameterTuningJob's JSON)")
    tune.add_argument("--max-trials", type=int, metavar="N",
                      help="trials to run in all (default: the file's max_trial_count, else 10)")
    tune.add_argument("--parallel", type=int, metavar="N",
                      help="trials at once (default: the file's parallel_trial_count, else 1)")
    tune.add_argument("--restart", action="store_true",
                      help="archive the study's database and trial directories (renamed with the time) and start "
                           "over; without it, a study already in the database is resumed")
    tune.add_argument("--storage", help="database URL (default: sqlite file beside the study file); "
                                        "postgresql://... lets several hosts --join one study")
    tune.add_argument("--devices", help="trial slots: auto (default: one GPU each if there are GPUs, else the cores split per "
                                        "parallel trial), cpu, cpu:0,1, cpu:0-1,2-3, gpu:0,1, or none")
    tune.add_argument("--join", action="store_true", help="join a study other hosts run on the same --storage")
    tune.add_argument("--export-best-to", metavar="MODEL_BASE_PATH",
                      help="when the study ends, export the best trial's model as the next version here")
    tune.add_argument("--plots", metavar="DIR", help="when the study ends (or with status), write plots "
                                                     "(optimization history, parallel coordinates, importances) here")
    tune.add_argument("--experiment", metavar="NAME",
                      help="also record the study as this Vertex AI experiment of the platform: one run per trial "
                           "with its parameters, final metrics and state (made if missing)")
    tune.add_argument("--platform", default=None, metavar="URL",
                      help="the platform that holds --experiment (default $MODELYARD_PLATFORM, else "
                           "http://127.0.0.1:8600; its token: $MODELYARD_PLATFORM_TOKEN)")
    tune.add_argument("--project", default="local", help="--experiment's project (default: local)")
    tune.add_argument("--location", default="us-central1", help="--experiment's location (default: us-central1)")
    tune.add_argument("--grace", type=float, default=3.0,
                      help="seconds a stopped (pruned) trial gets after SIGTERM before SIGKILL (default 3)")
    tune.add_argument("--poll", type=float, default=0.2, help=argparse.SUPPRESS)
    tune.set_defaults(func=run_tune)


def _error(message: str) -> int:
    print(f"modelyard tune: error: {message}", file=sys.stderr)
    return 2


def run_tune(args: argparse.Namespace) -> int:
    from modelyard.tuning.devices import DeviceError
    from modelyard.tuning.spec import SpecError, load, with_budget

    status = args.status == "status"
    if status and (args.restart or args.max_trials or args.parallel):
        return _error("`modelyard tune status STUDY` only reads the study; drop --restart, --max-trials, --parallel")
    try:
        study = with_budget(load(args.study, args.storage), args.max_trials, args.parallel)
        if args.join and study.storage.startswith("sqlite"):
            raise SpecError("--join needs a database several hosts reach: --storage postgresql://...; SQLite is "
                            "written by one tuning process only")
        if args.join and args.restart:
            raise SpecError("--restart with --join would archive the study under the other hosts; restart it "
                            "from one host without --join, then join")
        if status:
            return _status(study, args)
        from modelyard.tuning import devices

        slots = devices.parse(args.devices, study.parallel)
        if args.restart:
            _restart(study)
        return _run(study, slots, args)
    except (SpecError, DeviceError) as exc:
        return _error(str(exc))


def _restart(study) -> None:
    from modelyard.tuning.restart import archive

    moved = archive(study)
    if not moved:
        print(f"modelyard tune: --restart: no earlier run of study {study.name} to archive", flush=True)
    for what, where in moved:
        print(f"modelyard tune: --restart: archived the old study's {what} to {where}", flush=True)


def _status(study, args: argparse.Namespace) -> int:
    from modelyard.tuning.report import table
    from modelyard.tuning.study import counts, load_study

    ostudy = load_study(study, create=False)
    trials = ostudy.get_trials(deepcopy=False)
    tally = counts(trials)
    print(f"study {study.name}: {tally['complete']} complete, {tally['pruned']} pruned, {tally['failed']} failed, "
          f"{tally['running']} running of max_trial_count {study.max_trials}")
    print(table(study, trials))
    if args.plots:
        return _plots(study, ostudy, Path(args.plots))
    return 0


def _run(study, slots, args: argparse.Namespace) -> int:
    from modelyard.tuning.devices import SlotPool
    from modelyard.tuning.warm import start_warm

    recorder = None
    if args.experiment:  # before anything starts: a platform that cannot take the experiment stops us here
        from modelyard.tuning.experiment import RecordError, recorder_for

        try:
            recorder = recorder_for(study, args.experiment, args.platform, args.project, args.location, None)
        except RecordError as exc:
            return _error(f"--experiment {args.experiment}: {exc}")

    # Before Optuna is imported and the study opened (seconds): the warm processes import TensorFlow meanwhile.
    warm = start_warm(study, SlotPool(slots, study.parallel).free)
    try:
        from modelyard.tuning.report import LiveView, best_trials, table
        from modelyard.tuning.study import StudyFailed, Tuner

        view = LiveView(study)
        if recorder is not None:
            from modelyard.tuning.experiment import tee
        tuner = Tuner(study, slots, view if recorder is None else tee(view, recorder), poll_interval=args.poll, grace=args.grace,
                      export_model=bool(args.export_best_to), join=args.join, warm=warm)
    except BaseException:  # the study could not be opened: nobody else stops them
        for process in warm:
            if process is not None:
                process.shutdown()
        raise
    view.get_trials = lambda: tuner.ostudy.get_trials(deepcopy=False)
    print(f"modelyard tune: study {study.name} in {study.storage}; {study.max_trials} trial(s), "
          f"{tuner.pool.size} at a time on {', '.join(s.describe() for s in slots[:tuner.pool.size])}", flush=True)
    failed = None
    try:
        tuner.run()
    except StudyFailed as exc:
        failed = str(exc)
    trials = tuner.ostudy.get_trials(deepcopy=False)
    print(table(study, trials), flush=True)
    if failed:
        return _error(failed)
    best = best_trials(study, trials)
    if args.export_best_to:
        from modelyard.tuning.export import ExportError, export_best

        if not best:
            return _error("no trial completed; nothing to export")
        try:
            path = export_best(Path(best[0].user_attrs["job_dir"]) / "model", Path(args.export_best_to))
        except ExportError as exc:
            return _error(str(exc))
        print(f"modelyard tune: exported trial {best[0].number + 1}'s model as {path}")
    if args.plots:
        return _plots(study, tuner.ostudy, Path(args.plots))
    return 0


def _plots(study, ostudy, out: Path) -> int:
    from modelyard.tuning.plots import PlotError, write_plots

    try:
        for path in write_plots(study, ostudy, out):
            print(f"modelyard tune: wrote {path}")
    except PlotError as exc:
        return _error(str(exc))
    return 0
