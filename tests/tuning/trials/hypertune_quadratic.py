"""A trial written for Vertex AI: flags in, `cloudml-hypertune` out. Objective peaks at x=0.3, units=64;
`cost` (= units) is a second metric."""
import argparse
import math

import hypertune

parser = argparse.ArgumentParser()
parser.add_argument("--x", type=float, required=True)
parser.add_argument("--units", type=int, required=True)
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

hpt = hypertune.HyperTune()
for epoch in range(1, args.epochs + 1):
    score = 1.0 - (args.x - 0.3) ** 2 - 0.1 * (math.log2(args.units) - 6) ** 2
    hpt.report_hyperparameter_tuning_metric(hyperparameter_metric_tag="score", metric_value=score * epoch / args.epochs,
                                            global_step=epoch)
    # A second metric for multi-objective studies: the model's size.
    hpt.report_hyperparameter_tuning_metric(hyperparameter_metric_tag="cost", metric_value=args.units,
                                            global_step=epoch)
