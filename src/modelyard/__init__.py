"""modelyard: train, export, convert and serve TensorFlow models from one pip install.

Public API:
    modelyard.export(model, base_path) -> Path of the new version directory
"""
from modelyard import _tfenv  # noqa: F401  (sets TF/Keras environment before any TF import)

__version__ = "0.1.0"


def export(model, base_path, **kwargs):
    """Export a Keras model as the next integer version under ``base_path`` (see modelyard.model.export)."""
    from modelyard.model.export import export as _export

    return _export(model, base_path, **kwargs)


__all__ = ["export", "__version__"]
