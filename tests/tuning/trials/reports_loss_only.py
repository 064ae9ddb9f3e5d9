"""A trial that reports `loss` (hypertune) but never the study's metric."""
import hypertune

hpt = hypertune.HyperTune()
for step in (1, 2):
    hpt.report_hyperparameter_tuning_metric(hyperparameter_metric_tag="loss", metric_value=1.0 / step, global_step=step)
