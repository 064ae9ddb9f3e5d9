"""A model on disk and how to run it: the layer every capability builds on.

Holds reading SavedModels (``savedmodel``), the one signature and tensor-spec types
(``signatures``), the one dtype table (``dtypes``) and TensorProto <-> NumPy (``tensor_proto``), atomic versioned export (``export``),
what ``modelyard inspect`` shows (``inspect``), conversion of a signature to a TFLite
flatbuffer (``tflite``), and ``runtime/``: loading a version into TensorFlow or LiteRT and
running predict / classify / regress on it.

May import: ``modelyard.errors``, the checksum and framing leaves ``modelyard.crc32c`` and
``modelyard.tfrecord_frames``, and third-party libraries. Never ``serving``, ``edge``,
``training`` or any other capability: they import this.
"""
