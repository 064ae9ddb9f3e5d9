"""How the page turns a picture into the model's input: the ``preprocess`` part of a site's ``model.json``.

``convert --to web`` reads it off the model's input tensor (height, width, channels, dtype and
quantization) and lets flags override what a signature cannot say:

- ``--resize crop|pad|stretch``: how a picture of another aspect becomes the input's H x W
  (centre crop, pad with black, or stretch); the size itself is the model's, fixed for the web;
- ``--channels 1|3``: 1 feeds grey (on a 3-channel model, grey copied into R, G and B);
- ``--scale HI`` or ``LO,HI``: the model's value for a black and a white pixel (default 0,255:
  raw pixels, as models made for serving take them; ``--scale=-1,1``: argparse needs the ``=``
  before a negative value);
- ``--invert``: dark-on-light pictures (a digit written on paper) become light-on-dark;
- ``--labels FILE``: one class name a line, as many as the model's first output has classes.

The page (assets/app.js) applies it: crop, area-average resize, grey (ITU-R 601 luma), invert,
scale to ``[LO, HI]``, then quantize with the input's scale and zero point when it has them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from modelyard.model.tflite import ConvertError

FITS = ("crop", "pad", "stretch")
DRAW_MAX_SIDE = 64  # a grey input at most this big gets the drawing pad as well as pictures


@dataclass(frozen=True)
class PreprocessFlags:
    resize: str | None = None
    channels: int | None = None
    scale: str | None = None
    invert: bool = False
    labels: Path | None = None


def image_layout(shape: list[int]) -> tuple[int, int, int, bool]:
    """(height, width, channels, has a channel axis) of a ``[1, H, W]`` or ``[1, H, W, C]`` input."""
    if len(shape) == 3 and shape[0] == 1:
        return shape[1], shape[2], 1, False
    if len(shape) == 4 and shape[0] == 1 and shape[3] in (1, 3):
        return shape[1], shape[2], shape[3], True
    raise ConvertError(
        f"the web page feeds one image: the model must take one [1, H, W] (grey), [1, H, W, 1] or [1, H, W, 3] "
        f"input, not {shape}"
    )


def parse_scale(text: str) -> tuple[float, float]:
    """``HI`` or ``LO,HI`` -> (lo, hi): the model's values for black and white."""
    try:
        parts = [float(p) for p in text.split(",")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts = [0.0, parts[0]]
    if len(parts) != 2 or parts[0] == parts[1]:
        raise ConvertError(f"--scale {text!r}: give the value of a white pixel (255, 1) or LO,HI (--scale=-1,1)")
    return parts[0], parts[1]


def read_labels(path: Path, classes: int) -> list[str]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConvertError(f"--labels {path}: {exc.strerror or exc}") from exc
    labels = [line.strip() for line in lines if line.strip()]
    if len(labels) != classes:
        raise ConvertError(f"--labels {path} has {len(labels)} names; the model's output has {classes} classes")
    return labels


def _classes(outputs: list[dict]) -> int:
    shape = outputs[0]["shape"]
    return int(shape[-1]) if shape else 1


def preprocessing(tensor: dict, outputs: list[dict], flags: PreprocessFlags) -> dict:
    """The ``preprocess`` and ``labels`` entries of model.json for an input ``tensor`` (describe()'s)."""
    height, width, channels, channel_axis = image_layout(tensor["shape"])
    fed = channels
    if flags.channels is not None:
        if flags.channels not in (1, 3):
            raise ConvertError(f"--channels {flags.channels}: 1 (grey) or 3 (RGB)")
        if flags.channels == 3 and channels == 1:
            raise ConvertError("--channels 3: the model takes a grey image (one channel)")
        fed = flags.channels
    if flags.resize is not None and flags.resize not in FITS:
        raise ConvertError(f"--resize {flags.resize!r}: one of {', '.join(FITS)} (the size is the model's, "
                           f"{height}x{width})")
    lo, hi = parse_scale(flags.scale) if flags.scale is not None else (0.0, 255.0)
    labels = read_labels(flags.labels, _classes(outputs)) if flags.labels else None
    return {
        "preprocess": {
            "height": height, "width": width, "channels": channels, "channel_axis": channel_axis,
            "grey": fed == 1, "fit": flags.resize or "crop", "range": [lo, hi], "invert": flags.invert,
            "dtype": tensor["dtype"], "quant_scale": tensor["scale"], "quant_zero_point": tensor["zero_point"],
        },
        "draw": channels == 1 and max(height, width) <= DRAW_MAX_SIDE,
        "labels": labels,
    }
