"""TFRecord files read without TensorFlow (TF Serving's warmup requests, ``assets.extra``).

The framing and its checks are ``modelyard.tfrecord_frames``'; a record that is cut short or fails a check
raises ``TFRecordError`` with the offset.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from modelyard import tfrecord_frames
from modelyard.tfrecord_frames import FrameError


class TFRecordError(Exception):
    """The file is not a whole, intact TFRecord file; the message says where."""


def records(path: str | Path) -> Iterator[bytes]:
    """The records of the TFRecord file at ``path``, in order."""
    try:
        for pos, record, intact in tfrecord_frames.walk(Path(path).read_bytes()):
            if not intact:
                raise TFRecordError(f"corrupted record at {pos} in {path} (data checksum)")
            yield record
    except FrameError as exc:
        what = "corrupted record" if exc.kind == tfrecord_frames.BAD_LENGTH else "truncated record"
        detail = " (length checksum)" if exc.kind == tfrecord_frames.BAD_LENGTH else ""
        raise TFRecordError(f"{what} at {exc.offset} in {path}{detail}") from None
