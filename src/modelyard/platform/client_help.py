"""The help of ``modelyard models|endpoints|jobs ...``: each subcommand's one-line description, usage
line (as the README writes it) and examples, kept together here so every subcommand has all three
(``tests/test_cli_help.py`` walks them)."""
from __future__ import annotations

import argparse

from modelyard.cli_parser import examples

# (description, usage after the command's name, example lines) per "group action"; [options] are the
# connection flags every subcommand takes (--platform, --project, --location, --token).
_DOCS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "models": ("Upload SavedModels to a modelyard platform as Vertex AI models, list, describe and delete them.",
               "{upload,list,list-versions,aliases,describe,delete} ...",
               ("modelyard models upload --display-name mnist --artifact-uri models/my_mnist_model/0001",
                "modelyard models list")),
    "models upload": ("Upload a SavedModel directory as a new model, or as a new version of one (--parent-model).",
                      "--display-name NAME --artifact-uri URI [--parent-model ID] [options]",
                      ("modelyard models upload --display-name mnist --artifact-uri models/my_mnist_model/0001",
                       "modelyard models upload --display-name mnist --artifact-uri models/my_mnist_model/0002 "
                       "--parent-model 123")),
    "models list": ("List the platform's models (JSON).", "[options]", ("modelyard models list",)),
    "models list-versions": ("List every version of a model, with its aliases.", "MODEL [options]",
                             ("modelyard models list-versions 123",)),
    "models aliases": ("Add or remove a model version's aliases (an alias moves from the version that held it).",
                       "MODEL@VERSION [--add ALIAS ...] [--remove ALIAS ...] [options]",
                       ("modelyard models aliases 123@2 --add stable",)),
    "models describe": ("Show one model (its default version, or MODEL@VERSION).", "MODEL[@VERSION] [options]",
                        ("modelyard models describe 123", "modelyard models describe 123@1")),
    "models delete": ("Delete a model (or one version: MODEL@VERSION); it must not be deployed.",
                      "MODEL[@VERSION] [options]", ("modelyard models delete 123",)),
    "endpoints": ("Create endpoints, deploy models on them, split traffic and predict, on a modelyard platform.",
                  "{create,list,describe,delete,deploy,undeploy,update-traffic,predict} ...",
                  ("modelyard endpoints create --display-name mnist-endpoint",
                   "modelyard endpoints deploy 456 --model 123",
                   "modelyard endpoints predict 456 --instances '[[0.0, 1.0]]'")),
    "endpoints create": ("Create an endpoint (nothing deployed yet).", "--display-name NAME [--endpoint-id ID] [options]",
                         ("modelyard endpoints create --display-name mnist-endpoint",
                          "modelyard endpoints create --display-name mnist-endpoint --endpoint-id 1001")),
    "endpoints list": ("List the platform's endpoints (JSON).", "[options]", ("modelyard endpoints list",)),
    "endpoints describe": ("Show one endpoint: its deployed models and traffic split.", "ENDPOINT [options]",
                           ("modelyard endpoints describe 456",)),
    "endpoints delete": ("Delete an endpoint (undeploy its models first).", "ENDPOINT [options]",
                         ("modelyard endpoints delete 456",)),
    "endpoints deploy": ("Deploy a model on an endpoint; waits until its replicas serve.",
                         "ENDPOINT --model MODEL[@VERSION] [--min-replicas N] [--max-replicas N] "
                         "[--traffic-percentage P] [options]",
                         ("modelyard endpoints deploy 456 --model 123",
                          "modelyard endpoints deploy 456 --model 123@2 --traffic-percentage 10   # a canary")),
    "endpoints undeploy": ("Undeploy a deployed model from an endpoint (its replicas drain first).",
                           "ENDPOINT DEPLOYED_MODEL_ID [--traffic-split ID=PERCENT ...] [options]",
                           ("modelyard endpoints undeploy 456 789",)),
    "endpoints update-traffic": ("Set an endpoint's traffic split between its deployed models.",
                                 "ENDPOINT ID=PERCENT [ID=PERCENT ...] [options]",
                                 ("modelyard endpoints update-traffic 456 789=90 790=10",)),
    "endpoints predict": ("Send instances to an endpoint and print its predictions (JSON).",
                          "ENDPOINT --instances JSON|@FILE|- [options]",
                          ("modelyard endpoints predict 456 --instances '[[0.0, 1.0, 2.0, 3.0]]'",
                           "modelyard endpoints predict 456 --instances @instances.json",
                           "python3 make_instances.py | modelyard endpoints predict 456 --instances -")),
    "jobs": ("Submit, list, describe, follow and cancel jobs (custom training, tuning, batch prediction) on a "
             "modelyard platform.", "{submit,list,describe,logs,cancel} ...",
             ("modelyard jobs submit --config study.yaml --wait", "modelyard jobs list")),
    "jobs submit": ("Submit a job: a `modelyard tune` study file (its trial command shipped along), a modelyard "
                    "training config (run as `modelyard train`), or a Vertex CustomJob or HyperparameterTuningJob "
                    "spec (YAML or JSON).",
                    "--config FILE [--display-name NAME] [--wait] [options]",
                    ("modelyard jobs submit --config study.yaml --wait      # the study docs/tuning.md runs",
                     "modelyard jobs submit --config job.yaml              # a training config: modelyard train")),
    "jobs list": ("List every job (custom, tuning, batch prediction), oldest first.", "[options]",
                  ("modelyard jobs list",)),
    "jobs describe": ("Show a job's resource: state, error, trials, completion stats.", "JOB [options]",
                      ("modelyard jobs describe 321",)),
    "jobs logs": ("Print a job's log.", "JOB [options]", ("modelyard jobs logs 321",)),
    "jobs cancel": ("Cancel a job (its processes get SIGTERM) and show its state.", "JOB [options]",
                    ("modelyard jobs cancel 321",)),
}


def document(subparsers: argparse._SubParsersAction) -> None:
    """Give the platform client's parsers their description, usage and examples."""
    for group in ("models", "endpoints", "jobs"):
        parser = subparsers.choices.get(group)
        if parser is None:
            continue
        _apply(parser, group)
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        for action in actions:
            for name, sub in action.choices.items():
                _apply(sub, f"{group} {name}")


def _apply(parser: argparse.ArgumentParser, key: str) -> None:
    doc = _DOCS.get(key)
    if doc is None:
        return  # undocumented: tests/test_cli_help.py names it
    description, usage, lines = doc
    parser.description = description
    parser.usage = f"%(prog)s {usage}"
    parser.epilog = examples(*lines)
