"""A servable: one loaded model version that can run its signatures.

Backends (TensorFlow session, LiteRT) implement ``run``; everything above them sees
only this interface.
"""
from __future__ import annotations

import abc
from pathlib import Path

import numpy as np

from modelyard.model.signatures import Signature


class Servable(abc.ABC):
    """One loaded version. ``signature_def_map`` is the proto metadata returns."""

    runtime: str = "unknown"
    # Calls are cheap and never block (e.g. LiteRT on a small model): safe on the event loop.
    inline_ok: bool = False

    def __init__(self, path: Path, signatures: dict[str, Signature], signature_def_map):
        self.path = path
        self.signatures = signatures
        self.signature_def_map = signature_def_map

    @abc.abstractmethod
    def run(
        self, signature: Signature, inputs: dict[str, np.ndarray], output_aliases: tuple[str, ...]
    ) -> dict[str, np.ndarray]:
        """Run ``signature`` on validated inputs; return the requested outputs by alias."""

    def close(self) -> None:
        """Release the runtime's resources (sessions, interpreters)."""
