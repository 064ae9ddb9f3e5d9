"""``modelyard tune STUDY`` and ``modelyard tune status STUDY``: argument parsing, errors as short messages."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    tune = subparsers.add_parser(
        "tune", help="tune hyperparameters: run a study's trials in parallel, one per device",
        description="Run the study a YAML file describes (Vertex AI StudySpec): trials are runs of the training "
                    "command with the trial's hyperparameters as --name=value flags, one per device slot, "
                    "stopped early by the study's stopping rule. Run it again to resume. "
                    "`modelyard tune status STUDY` prints the trials.",
    )
    tune.add_argument("target", nargs="+", metavar="[status] STUDY", help="study YAML file (after `status`: show it)")
    tune.add_argument("--storage", help="database URL (default: sqlite file beside the study file); "
                                        "postgresql://... lets several hosts --join one study")
    tune.add_argument("--devices", help="trial slots: auto (default: one GPU each if there are GPUs, else the cores split per "
                                        "parallel trial), cpu, cpu:0,1, cpu:0-1,2-3, gpu:0,1, or none")
    tune.add_argument("--join", action="store_true", help="join a study other hosts run on the same --storage")
    tune.add_argument("--export-best-to", metavar="MODEL_BASE_PATH",
                      help="when the study ends, export the best trial's model as the next version here")
    tune.add_argument("--plots", metavar="DIR", help="when the study ends (or with status), write plots "
                                                     "(optimization history, parallel coordinates, importances) here")
    tune.add_argument("--grace", type=float, default=3.0,
                      help="seconds a stopped (pruned) trial gets after SIGTERM before SIGKILL (default 3)")
    tune.add_argument("--poll", type=float, default=0.2, help=argparse.SUPPRESS)
    tune.set_defaults(func=run_tune)


def _error(message: str) -> int:
    print(f"modelyard tune: error: {message}", file=sys.stderr)
    return 2


def run_tune(args: argparse.Namespace) -> int:
    from modelyard.tuning.devices import DeviceError
    from modelyard.tuning.spec import SpecError, load

    target = args.target
    status = target[0] == "status" and len(target) == 2
    if len(target) != 1 and not status:
        return _error("give one study file: modelyard tune STUDY or modelyard tune status STUDY")
    try:
        study = load(target[-1], args.storage)
        if args.join and study.storage.startswith("sqlite"):
            raise SpecError("--join needs a database several hosts reach: --storage postgresql://...; SQLite is "
                            "written by one tuning process only")
        if status:
            return _status(study, args)
        from modelyard.tuning import devices

        slots = devices.parse(args.devices, study.parallel)
        return _run(study, slots, args)
    except (SpecError, DeviceError) as exc:
        return _error(str(exc))


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
    from modelyard.tuning.report import LiveView, best_trials, table
    from modelyard.tuning.study import StudyFailed, Tuner

    view = LiveView(study)
    tuner = Tuner(study, slots, view, poll_interval=args.poll, grace=args.grace,
                  export_model=bool(args.export_best_to), join=args.join)
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
