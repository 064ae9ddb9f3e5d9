"""modelyard's own Cloud Storage (``python -m modelyard.platform.storage``, the code ``modelyard platform``
serves) as a test process: the session's ``gcs_emulator`` fixture (tests/conftest.py) and the storage
tests start it here. The platform fixture serves its own storage over the same root, so a test's
client and the platform's jobs see the same objects through either port."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from modelyard.ports import free_port

REPO_SRC = Path(__file__).resolve().parents[1] / "src"


class StorageProcess:
    def __init__(self, root: Path, log: Path, extra: list[str] = (), env: dict | None = None) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = dict(os.environ if env is None else env)
        full_env["PYTHONPATH"] = str(REPO_SRC) + os.pathsep + full_env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen([sys.executable, "-m", "modelyard.platform.storage", "--root", str(root),
                                      "--port", str(self.port), *extra],
                                     stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=full_env)
        self.log = log

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def storage_session(tmp_path_factory, bucket: str):
    """Start the storage, point this process's clients at it (STORAGE_EMULATOR_HOST), create ``bucket``;
    yields ``{"host", "client", "root"}`` and stops it at the end."""
    from tests.platform.conftest import require, wait_http

    storage = require("google.cloud.storage", "pip install -e '.[test]' (google-cloud-aiplatform brings it)")
    import google.auth.credentials

    work = tmp_path_factory.mktemp("gcs")
    p = StorageProcess(work / "root", work / "storage.log")
    try:
        wait_http(p.url + "/storage/v1/b", 30, p.proc, p.log)
        os.environ["STORAGE_EMULATOR_HOST"] = p.url  # for the SDK's storage client in this process
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # gcsfs: no gRPC layout probe
        client = storage.Client(project="local", credentials=google.auth.credentials.AnonymousCredentials())
        client.create_bucket(bucket)
        yield {"host": p.url, "client": client, "root": p.root}
    finally:
        os.environ.pop("STORAGE_EMULATOR_HOST", None)
        p.stop()
