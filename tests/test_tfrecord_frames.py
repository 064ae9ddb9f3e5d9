"""The shared CRC-32C and TFRecord framing (modelyard.crc32c, modelyard.tfrecord_frames), without files or
processes: the batch reader's and the warmup reader's tests run them on real files."""
from __future__ import annotations

import pytest

from modelyard import tfrecord_frames
from modelyard.crc32c import crc32c, mask, masked_crc, unmask
from modelyard.tfrecord_frames import FrameError, frame, header_length, walk


def test_crc32c_is_castagnoli_and_continues():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720, B.4)
    assert crc32c(b"56789", crc32c(b"1234")) == crc32c(b"123456789")
    for value in (0, 1, 0xE3069283, 0xFFFFFFFF):
        assert unmask(mask(value)) == value
    assert masked_crc(b"abc") == mask(crc32c(b"abc"))


def test_a_record_framed_as_tensorflow_frames_it():
    # tf.io.TFRecordWriter's bytes for the record b"one"
    assert frame(b"one") == bytes.fromhex("0300000000000000b099490e6f6e6501405508")
    assert header_length(frame(b"one")[:12]) == 3


def test_walk_reads_records_and_says_where_the_framing_ends():
    payloads = [b"", b"one", bytes(range(256)) * 4]
    data = b"".join(frame(p) for p in payloads)
    assert [(data_, ok) for _, data_, ok in walk(data)] == [(p, True) for p in payloads]
    assert list(walk(bytearray(data)))[1] == (16, b"one", True)  # not bytes: read all the same

    damaged = bytearray(data)
    damaged[16 + 12] ^= 1  # a byte of b"one": that record's data CRC fails, the framing holds
    assert [ok for _, _, ok in walk(damaged)] == [True, False, True]

    cases = [(data + b"\0" * 5, tfrecord_frames.TRUNCATED_HEADER, len(data)),
             (data[:-1], tfrecord_frames.TRUNCATED_DATA, 16 + 19),
             (data[:16] + b"\1" + data[17:], tfrecord_frames.BAD_LENGTH, 16)]
    for buf, kind, offset in cases:
        with pytest.raises(FrameError) as caught:
            list(walk(buf))
        assert (caught.value.kind, caught.value.offset) == (kind, offset)
