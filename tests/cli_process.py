"""Run the real ``modelyard`` command as a newcomer would: none of the test suite's logging variables set."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The lines TensorFlow's libraries print while loading on a machine without a GPU, and LiteRT's first allocation.
NOISE = re.compile(r"oneDNN|cuInit|cuda|absl::InitializeLog|XNNPACK", re.IGNORECASE)


def modelyard(*args: str, env_extra: dict[str, str] | None = None, cwd: Path | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the ``modelyard`` command as a user would, with no logging variables of ours set."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "MODELYARD_LOG_LEVEL",
                                                             "MODEL_NAME", "MODEL_BASE_PATH", "TF_CONFIG")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), str(REPO), env.get("PYTHONPATH")]))
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "modelyard", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=timeout)
