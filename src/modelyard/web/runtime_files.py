"""LiteRT.js's JS and wasm files, taken from npm's ``@litertjs/core`` at convert time.

Nothing of the runtime is in the repository: ``npm install`` fills a cache directory
once (``<cache>/npm/litertjs-core-<version>``) and every site copies from there.
``MODELYARD_LITERTJS_DIR`` may name an already installed ``node_modules`` instead.
"""
from __future__ import annotations

import fcntl
import gzip
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from modelyard.demo import default_cache_dir
from modelyard.model.tflite import ConvertError

LITERTJS_VERSION = "2.5.3"  # the version checked in headless Chromium here
PACKAGE = "@litertjs/core"
# The page runs on the wasm CPU path without threads or JSPI: loadLiteRt(dir) picks
# between these two (relaxed SIMD or not), so the other variants are not copied.
WASM_VARIANTS = ("litert_wasm_internal", "litert_wasm_compat_internal")


class RuntimeUnavailable(ConvertError):
    """npm or the registry could not be reached; the message says how to get the files."""


@dataclass(frozen=True)
class RuntimeFiles:
    core_js: Path  # @litertjs/core/dist/index.js
    wasm_utils_js: Path  # @litertjs/wasm-utils/dist/index.js (imported by core)
    wasm: list[Path]  # the .js loader and .wasm of each variant


def _how_to_get() -> str:
    return (
        f"modelyard needs {PACKAGE}@{LITERTJS_VERSION} from the npm registry: install Node.js's npm "
        "(Debian: apt-get install -y npm) and allow access to the npm registry, or install it yourself "
        f"(npm install --prefix DIR {PACKAGE}@{LITERTJS_VERSION}) and set MODELYARD_LITERTJS_DIR=DIR/node_modules"
    )


def _files_in(node_modules: Path) -> RuntimeFiles | None:
    core = node_modules / "@litertjs" / "core"
    files = RuntimeFiles(
        core / "dist" / "index.js",
        node_modules / "@litertjs" / "wasm-utils" / "dist" / "index.js",
        [core / "wasm" / f"{v}.{ext}" for v in WASM_VARIANTS for ext in ("js", "wasm")],
    )
    present = [files.core_js, files.wasm_utils_js, *files.wasm]
    return files if all(p.is_file() for p in present) else None


def cache_dir() -> Path:
    return default_cache_dir() / "npm" / f"litertjs-core-{LITERTJS_VERSION}"


def ensure_runtime(log=print) -> RuntimeFiles:
    """The runtime files, installed into the cache with npm on first use."""
    override = os.environ.get("MODELYARD_LITERTJS_DIR")
    if override:
        found = _files_in(Path(override))
        if found is None:
            raise RuntimeUnavailable(f"MODELYARD_LITERTJS_DIR={override} holds no {PACKAGE} with its wasm files. {_how_to_get()}")
        return found
    target = cache_dir()
    found = _files_in(target / "node_modules")
    if found is not None:
        return _with_gzip(found)
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeUnavailable(f"npm was not found on PATH. {_how_to_get()}")
    target.mkdir(parents=True, exist_ok=True)
    # Two converts at once (two test workers, two terminals) must not run npm into one folder together:
    # the second waits for the first and then finds the files.
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = _files_in(target / "node_modules")
        if found is not None:
            return _with_gzip(found)
        return _npm_install(npm, target, log)


def _npm_install(npm: str, target: Path, log) -> RuntimeFiles:
    log(f"fetching {PACKAGE}@{LITERTJS_VERSION} with npm into {target}")
    command = [npm, "install", "--prefix", str(target), "--no-audit", "--no-fund", "--ignore-scripts",
               "--no-save", "--loglevel=error", f"{PACKAGE}@{LITERTJS_VERSION}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeUnavailable(f"npm install timed out (no network?). {_how_to_get()}") from exc
    found = _files_in(target / "node_modules")
    if done.returncode != 0 or found is None:
        raise RuntimeUnavailable(f"npm install {PACKAGE}@{LITERTJS_VERSION} failed: {_npm_reason(done)}. {_how_to_get()}")
    return _with_gzip(found)


_OFFLINE = ("ECONNREFUSED", "ENOTFOUND", "ETIMEDOUT", "EAI_AGAIN", "ENETUNREACH", "ECONNRESET")


def _npm_reason(done: subprocess.CompletedProcess) -> str:
    """npm's error code and first message line (its stack trace says nothing to a user)."""
    lines = [line.removeprefix("npm error").strip() for line in (done.stderr or done.stdout or "").splitlines()]
    code = next((line.split()[-1] for line in lines if line.startswith("code ")), None)
    message = next((line for line in lines if line and not line.startswith(("code ", "syscall ", "errno "))), "")
    if code in _OFFLINE:
        return f"the npm registry could not be reached ({code}: {message})"
    return f"{code or f'exit {done.returncode}'}: {message}" if message else (code or f"exit {done.returncode}")


def gzipped(path: Path) -> Path:
    return path.with_name(path.name + ".gz")


def _with_gzip(files: RuntimeFiles) -> RuntimeFiles:
    """Compress the wasm builds once in the cache, so no site and no server compresses them again."""
    for path in files.wasm:
        target = gzipped(path)
        if target.is_file() and target.stat().st_mtime_ns >= path.stat().st_mtime_ns:
            continue
        temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.gz")
        temp.write_bytes(gzip.compress(path.read_bytes(), compresslevel=6, mtime=0))
        os.replace(temp, target)
    return files
