"""modelyard: train, export, convert and serve TensorFlow models from one pip install.

Public API:
    modelyard.export(model, base_path) -> Path of the new version directory
    modelyard.batch_predict(model, input, output, ...) -> BatchPredictionJob
    modelyard.tune(study, objective, ...) -> TuneResult (function trials in warm workers)

May import: its packages, lazily (``import modelyard`` must not load TensorFlow). Layers and
who may import whom: docs/architecture.md, checked by tests/test_layers.py.
"""
from modelyard import _tfenv  # noqa: F401  (sets TF/Keras environment before any TF import)

__version__ = "0.1.0"


def export(model, base_path, **kwargs):
    """Export a Keras model as the next integer version under ``base_path`` (see modelyard.model.export)."""
    from modelyard.model.export import export as _export

    return _export(model, base_path, **kwargs)


def batch_predict(*args, **kwargs):
    """Run a batch prediction job (see modelyard.batch.api.batch_predict); returns the job."""
    from modelyard.batch.api import batch_predict as _batch_predict

    return _batch_predict(*args, **kwargs)


def tune(study, objective, **kwargs):
    """Run a study with ``objective(params, report)`` as its trials (see modelyard.tuning.api.tune)."""
    from modelyard.tuning.api import tune as _tune

    return _tune(study, objective, **kwargs)


__all__ = ["export", "batch_predict", "tune", "__version__"]
