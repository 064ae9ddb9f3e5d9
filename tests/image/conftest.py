"""The image tests' one fixture: the images of this source, built once (scripts/image --if-changed)."""
from __future__ import annotations

import pytest

from tests.image import podman


@pytest.fixture(scope="session")
def images() -> dict[str, str]:
    """podman's environment, once both images carry this checkout's source key."""
    return podman.ensure_images()
