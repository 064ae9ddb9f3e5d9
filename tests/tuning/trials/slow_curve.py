"""A trial with a learning curve: `score` = quality * (1 - 0.5**epoch) for --epochs epochs of
--epoch-seconds each. Every epoch appends its time to epochs.log, so a test can see when it
really stopped. --ignore-term (or a quality at or below $IGNORE_TERM_AT_OR_BELOW) makes it ignore SIGTERM,
so only SIGKILL stops it."""
import argparse
import os
import signal
import time

import hypertune

parser = argparse.ArgumentParser()
parser.add_argument("--quality", type=float, required=True)
parser.add_argument("--epochs", type=int, default=40)
parser.add_argument("--epoch-seconds", type=float, default=0.1)
parser.add_argument("--ignore-term", action="store_true")
args, _ = parser.parse_known_args()
if args.ignore_term or args.quality <= float(os.environ.get("IGNORE_TERM_AT_OR_BELOW", "-1")):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

hpt = hypertune.HyperTune()
log = os.path.join(os.environ["MODELYARD_JOB_DIR"], "epochs.log")
for epoch in range(1, args.epochs + 1):
    time.sleep(args.epoch_seconds)
    hpt.report_hyperparameter_tuning_metric("score", args.quality * (1 - 0.5 ** epoch), global_step=epoch)
    with open(log, "a") as f:
        f.write(f"{epoch} {time.time()}\n")
