"""Train several configs one after the other in one process, for the option x strategy matrix
(tests/training/test_matrix.py): one TensorFlow start-up (and, under ``modelyard launch``, one
cluster) for many cells instead of one process each.

    python3 tests/training/matrix_runner.py CELL.yaml ...

Each config goes through what ``modelyard train`` runs (``config.load``, then ``trainer.run``);
for each, one line ``MATRIX {json}`` on stdout: ``outcome`` is ``trained`` (with the epoch
losses), ``refused`` (a ConfigError or TrainError: the one-line message) or ``error`` (any other
exception: its traceback's last lines; the next cells still run).
"""
from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path


def run_cell(path: Path) -> dict:
    from modelyard.training import config as config_mod
    from modelyard.training import trainer

    cell = {"cell": path.stem}
    try:
        cfg = config_mod.load(path)
    except config_mod.ConfigError as exc:
        return cell | {"outcome": "refused", "stage": "config", "message": str(exc)}
    try:
        result = trainer.run(cfg)
    except (config_mod.ConfigError, trainer.TrainError) as exc:
        return cell | {"outcome": "refused", "stage": "run", "message": str(exc)}
    except Exception:  # noqa: BLE001  (a cell that breaks is the finding; the others still run)
        return cell | {"outcome": "error", "message": "".join(traceback.format_exc().splitlines(True)[-12:])}
    return cell | {"outcome": "trained", "losses": [epoch["loss"] for epoch in result.get("epochs", [])],
                   "replicas": result.get("replicas"), "exported": result.get("exported")}


def main(paths: list[str]) -> int:
    import modelyard  # noqa: F401  (TF environment before TF)

    for path in paths:
        start = time.perf_counter()
        record = run_cell(Path(path))
        print("MATRIX " + json.dumps(record | {"seconds": round(time.perf_counter() - start, 2)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
