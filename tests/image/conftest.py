"""The image tests' one fixture: the images of this source, built once (scripts/image --if-changed)."""
from __future__ import annotations

import pytest

from tests.image import podman


@pytest.fixture(scope="session")
def images() -> str:
    """The source key both images carry, once they are this checkout's."""
    return podman.ensure_images()
