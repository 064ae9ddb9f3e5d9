"""Two converts at once on a fresh machine (two test workers, two terminals) fetch LiteRT.js once: the
second waits on the cache's lock, then finds the files the first installed."""
from __future__ import annotations

import threading
import time

from modelyard.web import runtime_files


def test_concurrent_first_uses_install_the_runtime_once(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELYARD_CACHE", str(tmp_path))
    monkeypatch.delenv("MODELYARD_LITERTJS_DIR", raising=False)
    installs = []

    def fake_install(npm, target, log):  # writes what npm would, slowly, so the two calls overlap
        installs.append(target)
        time.sleep(0.5)
        files = runtime_files._files_in(target / "node_modules")
        for path in [runtime_files.Path(target / "node_modules" / "@litertjs" / "core" / "dist" / "index.js"),
                     target / "node_modules" / "@litertjs" / "wasm-utils" / "dist" / "index.js",
                     *[target / "node_modules" / "@litertjs" / "core" / "wasm" / f"{v}.{ext}"
                       for v in runtime_files.WASM_VARIANTS for ext in ("js", "wasm")]]:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x")
        assert files is None
        return runtime_files._with_gzip(runtime_files._files_in(target / "node_modules"))

    monkeypatch.setattr(runtime_files, "_npm_install", fake_install)
    monkeypatch.setattr(runtime_files.shutil, "which", lambda name: "/usr/bin/npm")
    results = []
    threads = [threading.Thread(target=lambda: results.append(runtime_files.ensure_runtime(log=lambda m: None)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(installs) == 1 and len(results) == 2
    assert results[0].core_js == results[1].core_js and results[0].core_js.is_file()
