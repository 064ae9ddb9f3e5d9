"""A self-contained web site that runs a ``.tflite`` digits model in the visitor's browser.

``write_site`` lays out::

    site/index.html  app.js  style.css      the page (package data, no build step)
    site/model.tflite  model.json            the model and what the page needs to know of it
    site/runtime/litertjs/core.js  wasm-utils.js  wasm/...   LiteRT.js from npm

The page draws on a canvas and feeds a 28x28 image, so the model must take one
``[1, 28, 28]`` (or ``[1, 28, 28, 1]``) tensor of a dtype LiteRT.js has (float32,
int32, uint8). The folder is written next to ``out`` and renamed into place, so a
failure leaves nothing half-written.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
from importlib import resources
from pathlib import Path

import numpy as np

from modelyard.model.tflite import ConvertError
from modelyard.web.runtime_files import LITERTJS_VERSION, ensure_runtime, gzipped

PAGE_FILES = ("index.html", "app.js", "style.css")
MODEL_FILE = "model.tflite"
INFO_FILE = "model.json"
# Tensor types LiteRT.js can hand to JavaScript (its DATATYPES table).
JS_DTYPES = ("float32", "int32", "uint8")
DIGIT_SHAPES = ([1, 28, 28], [1, 28, 28, 1])


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
    if len(inputs) != 1 or inputs[0]["shape"] not in DIGIT_SHAPES:
        shapes = ", ".join(str(i["shape"]) for i in inputs)
        raise ConvertError(
            f"the web page draws one 28x28 image: the model must take one [1, 28, 28] or [1, 28, 28, 1] "
            f"input, not {shapes}"
        )
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
               log=print) -> Path:
    """Write the site for ``content`` (an already batch-fixed ``.tflite``) at ``out``; return ``out``.

    ``out`` must not exist or be an earlier site (it is replaced whole).
    """
    out = Path(out)
    info = describe(content)
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
        (temp / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        _copy_page(temp)
        _copy_runtime(temp, log)
        if out.exists():
            shutil.rmtree(out)
        os.rename(temp, out)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return out
