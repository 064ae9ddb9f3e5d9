"""A self-contained web app that runs a ``.tflite`` image classifier in the visitor's browser.

``write_site`` lays out::

    site/index.html  app.js  style.css      the page (package data, no build step)
    site/model.tflite  model.json            the model and what the page needs to know of it
    site/manifest.webmanifest  icon-*.png  sw.js    installable, offline (``offline``)
    site/runtime/litertjs/core.js  wasm-utils.js  wasm/...   LiteRT.js from npm

The page takes a picture (file, drop, paste, camera) or, for a small grey input, a
drawing, and feeds it as ``preprocess`` in model.json says; the model must take one
``[1, H, W]``, ``[1, H, W, 1]`` or ``[1, H, W, 3]`` tensor of a dtype LiteRT.js has
(float32, int32, uint8). The folder is written next to ``out`` and renamed into place,
so a failure leaves nothing half-written.
"""
from __future__ import annotations

import gzip
import json
import os
import secrets
import shutil
from importlib import resources
from pathlib import Path

import numpy as np

from modelyard.model.tflite import ConvertError
from modelyard.web import offline
from modelyard.web.preprocess import PreprocessFlags, image_layout, preprocessing
from modelyard.web.runtime_files import LITERTJS_VERSION, WASM_VARIANTS, ensure_runtime, gzipped

PAGE_FILES = ("index.html", "app.js", "style.css")
MODEL_FILE = "model.tflite"
INFO_FILE = "model.json"
# Tensor types LiteRT.js can hand to JavaScript (its DATATYPES table).
JS_DTYPES = ("float32", "int32", "uint8")


def _tensor_info(detail: dict) -> dict:
    scale, zero_point = detail.get("quantization", (0.0, 0))
    return {
        "name": detail["name"],
        "shape": [int(d) for d in detail["shape"]],
        "dtype": np.dtype(detail["dtype"]).name,
        "scale": float(scale),
        "zero_point": int(zero_point),
    }


def describe(content: bytes) -> dict:
    """Input and outputs of a ``.tflite`` model; rejects models the page cannot feed."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content)
    inputs = [_tensor_info(d) for d in interpreter.get_input_details()]
    outputs = [_tensor_info(d) for d in interpreter.get_output_details()]
    if len(inputs) != 1:
        shapes = ", ".join(str(i["shape"]) for i in inputs)
        raise ConvertError(f"the web page feeds one image: the model must take one input, not {shapes}")
    image_layout(inputs[0]["shape"])
    for tensor in inputs + outputs:
        if tensor["dtype"] not in JS_DTYPES:
            raise ConvertError(
                f"tensor {tensor['name']!r} is {tensor['dtype']}; LiteRT.js passes only "
                f"{', '.join(JS_DTYPES)} tensors to the page (for --quantize int8 use --io-dtype uint8 or float32)"
            )
    return {"input": inputs[0], "outputs": outputs}


def _copy_page(target: Path) -> None:
    assets = resources.files("modelyard.web") / "assets"
    for name in PAGE_FILES:
        (target / name).write_bytes((assets / name).read_bytes())


def _copy_runtime(target: Path, log) -> None:
    files = ensure_runtime(log)
    runtime = target / "runtime" / "litertjs"
    (runtime / "wasm").mkdir(parents=True)
    shutil.copyfile(files.core_js, runtime / "core.js")
    shutil.copyfile(files.wasm_utils_js, runtime / "wasm-utils.js")
    for path in files.wasm:
        shutil.copyfile(path, runtime / "wasm" / path.name)
        if gzipped(path).is_file():  # copied after its source: the server sees it is up to date
            shutil.copyfile(gzipped(path), runtime / "wasm" / gzipped(path).name)


def write_site(content: bytes, out: Path, *, quantize: str, source: str, model_name: str | None,
               flags: PreprocessFlags = PreprocessFlags(), log=print) -> Path:
    """Write the site for ``content`` (an already batch-fixed ``.tflite``) at ``out``; return ``out``.

    ``out`` must not exist or be an earlier site (it is replaced whole).
    """
    out = Path(out)
    info = describe(content)
    info.update(preprocessing(info["input"], info["outputs"], flags))
    if out.exists() and not (out / INFO_FILE).is_file():
        raise ConvertError(f"{out} exists and is not a modelyard web site; choose a new directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    temp = out.parent / f".{out.name}.tmp-{secrets.token_hex(4)}"
    temp.mkdir()
    try:
        (temp / MODEL_FILE).write_bytes(content)
        info.update(
            model=MODEL_FILE, bytes=len(content), quantize=quantize, source=source,
            model_name=model_name, litertjs=LITERTJS_VERSION,
            serve_url=f"http://localhost:8501/v1/models/{model_name}" if model_name else None,
        )
        _copy_page(temp)
        _copy_runtime(temp, log)
        page = [(temp / name).read_bytes() for name in PAGE_FILES]
        worker = (resources.files("modelyard.web") / "assets" / offline.WORKER).read_bytes()
        version = offline.version_of([content, json.dumps(info, sort_keys=True).encode(), *page, worker])
        info.update(version=version, caches=offline.cache_names(version, LITERTJS_VERSION))
        (temp / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        offline.write_app_files(temp, model_name or "model", version, info["caches"])
        if out.exists():
            shutil.rmtree(out)
        os.rename(temp, out)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return out


def first_visit_files(site: Path) -> list[Path]:
    """What a browser fetches on a first visit: every file but the wasm build it does not pick
    (the compat one, for browsers without relaxed SIMD) and the precompressed copies."""
    skip = {f"{WASM_VARIANTS[1]}.js", f"{WASM_VARIANTS[1]}.wasm"}
    return [p for p in sorted(site.rglob("*")) if p.is_file() and p.suffix != ".gz" and p.name not in skip]


def _gzip_size(path: Path) -> int:
    ready = gzipped(path)
    if ready.is_file():
        return ready.stat().st_size
    data = path.read_bytes()
    return len(gzip.compress(data, compresslevel=6, mtime=0)) if path.suffix not in (".png",) else len(data)


def summary(site: Path) -> str:
    """What is in the site, by part, with sizes on disk and as ``modelyard web`` sends them (gzip)."""
    site = Path(site)
    files = [p for p in sorted(site.rglob("*")) if p.is_file()]
    groups: dict[str, list[Path]] = {}
    for path in files:
        rel = path.relative_to(site).as_posix()
        if path.suffix == ".gz":
            part = "precompressed wasm (served as gzip)"
        elif rel.startswith("runtime/") and path.suffix == ".wasm":
            part = "LiteRT.js wasm (2 builds; a browser fetches 1)"
        elif rel.startswith("runtime/"):
            part = "LiteRT.js JS"
        elif path.suffix == ".tflite":
            part = "model"
        elif path.name in (offline.MANIFEST, offline.WORKER) or path.suffix == ".png":
            part = "app: manifest, icons, service worker"
        else:
            part = "page and config"
        groups.setdefault(part, []).append(path)
    lines = []
    for part, paths in groups.items():
        size = sum(p.stat().st_size for p in paths)
        lines.append(f"  {part:<48} {size:>12,} bytes  {len(paths):>2} files")
    visit = sum(_gzip_size(p) for p in first_visit_files(site))
    lines.append(f"  a first visit transfers about {visit:,} bytes (gzip); later visits and offline starts "
                 f"come from the service worker's cache")
    return "\n".join(lines)
