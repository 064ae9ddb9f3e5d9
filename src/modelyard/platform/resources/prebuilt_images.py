"""Vertex AI's prebuilt prediction images for scikit-learn and XGBoost: which image URIs name them,
and the check of an upload that names one.

``Model.upload_scikit_learn_model_file`` / ``upload_xgboost_model_file`` (and any upload with such a
``serving_container_image_uri``) name an image such as
``us-docker.pkg.dev/vertex-ai/prediction/sklearn-cpu.1-0:latest`` or ``.../xgboost-cpu.1-4:latest``.
Here no image runs: the replicas are ``modelyard serve``, which serves the artifact's
``model.joblib`` / ``model.pkl`` / ``model.bst`` as those images do (``model.runtime.estimators``).
So an upload naming one is refused at once when the artifact holds none of the image's files
(INVALID_ARGUMENT), or when the library is not installed on the platform's host
(FAILED_PRECONDITION, with the install command), instead of a replica failing at deploy.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from modelyard.model.runtime import estimators
from modelyard.platform.api.errors import ApiError, invalid

# [region]-docker.pkg.dev/vertex-ai/prediction/[framework]-[accelerator].[version]:latest, as the SDK's
# helpers.get_prebuilt_prediction_container_uri builds them (a GPU build of XGBoost runs on the CPU here).
IMAGE = re.compile(r"(?:us|europe|asia)-docker\.pkg\.dev/vertex-ai/prediction/"
                   r"(?P<framework>sklearn|xgboost)-(?:cpu|gpu)\.(?P<version>\d+-\d+):latest")
_NAMES = {estimators.SKLEARN: "scikit-learn", estimators.XGBOOST: "XGBoost"}


def image_framework(image_uri: str) -> str | None:
    """``sklearn`` or ``xgboost`` for one of Vertex's prebuilt images of them, else None."""
    match = IMAGE.fullmatch(image_uri.strip()) if isinstance(image_uri, str) else None
    return match.group("framework") if match else None


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported here (found, not imported: the platform stays light)."""
    return importlib.util.find_spec(module) is not None


def _require(framework: str, why: str) -> None:
    module = estimators.MODULES[framework]
    if not _installed(module):
        raise ApiError("FAILED_PRECONDITION", f"{why} needs {_NAMES[framework]} ({module}) on the platform's "
                                              f"host, which does not have it: {estimators.INSTALL[framework]}")


def check_upload(container_spec: dict, path: Path, uri: str) -> None:
    """Refuse an upload whose prebuilt image cannot serve the artifact at ``path`` (``uri`` as given)."""
    image = (container_spec or {}).get("imageUri") or ""
    framework = image_framework(image)
    if framework is None:
        found = estimators.model_file(path)
        if found is not None and found.name == "model.bst":  # only XGBoost reads that file
            _require(estimators.XGBOOST, f"artifact_uri {uri!r} (model.bst)")
        return
    wanted = estimators.MODEL_FILES[framework]
    if not any((path / name).is_file() for name in wanted):
        raise invalid(f"artifact_uri {uri!r}: the {_NAMES[framework]} prebuilt image {image} serves "
                      f"{' or '.join(wanted)}, and {path} holds none of them")
    _require(framework, f"the {_NAMES[framework]} prebuilt image {image}")
