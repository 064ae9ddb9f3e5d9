"""What one model version's files weigh: the floor of what it costs a deployment resource pool's budget.

One rule for both sides of a pool: the platform refuses at deploy a model whose files alone could never
fit its pool's budget, and each pool replica (``serving/manager/on_demand.py``) weighs a model not yet
measured by its files. File bytes are known before loading and the same on every host; what a loaded
model holds in memory varies with the runtime (a LiteRT model about its flatbuffer, a TensorFlow session
a few times its variables), so the replica measures that at load and counts the larger of the two.
"""
from __future__ import annotations

import os
from pathlib import Path


def footprint_bytes(version_dir: str | os.PathLike) -> int:
    """The total size of the regular files under ``version_dir`` (a symlinked directory followed once)."""
    total = 0
    for root, _dirs, files in os.walk(os.path.realpath(version_dir)):
        for name in files:
            try:
                total += os.stat(Path(root) / name).st_size
            except OSError:  # a file removed meanwhile weighs nothing
                pass
    return total
