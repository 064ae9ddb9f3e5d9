"""TF Serving's BatchingParameters text files, read into checked ``BatchingParams``.

The global file comes from ``--batching_parameters_file``; a version directory may carry
its own ``batching_params.pbtxt`` that replaces it for that version. Unset fields take
TF Serving's defaults (its SharedBatchScheduler / BasicBatchScheduler options):
max_batch_size 1000, batch_timeout_micros 0, max_enqueued_batches 10, one batch
thread per core. The pip package has no session_bundle_config_pb2, so the message is
built here from its field list (same names, numbers and wrapper types), which keeps
``text_format`` strict: a misspelt field or a bad value fails with the line it is on.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from modelyard.errors import invalid_argument
from modelyard.serving.textproto import parse_text_proto, read_flag_file

PER_VERSION_FILE = "batching_params.pbtxt"

# TF Serving's defaults when a field (or the whole file) is absent.
DEFAULT_MAX_BATCH_SIZE = 1000
DEFAULT_BATCH_TIMEOUT_MICROS = 0
DEFAULT_MAX_ENQUEUED_BATCHES = 10


def _default_threads() -> int:
    return os.cpu_count() or 1


@dataclass(frozen=True)
class BatchingParams:
    """One servable's batching knobs, already checked (see ``check``)."""

    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    batch_timeout_micros: int = DEFAULT_BATCH_TIMEOUT_MICROS
    max_enqueued_batches: int = DEFAULT_MAX_ENQUEUED_BATCHES
    num_batch_threads: int = field(default_factory=_default_threads)
    allowed_batch_sizes: tuple[int, ...] = ()
    pad_variable_length_inputs: bool = False
    thread_pool_name: str = "model_server_batch_threads"

    def check(self, source: str = "batching parameters") -> "BatchingParams":
        """Refuse values TF Serving refuses; the message names the file and the fix."""
        for name in ("max_batch_size", "max_enqueued_batches", "num_batch_threads"):
            if getattr(self, name) < 1:
                raise invalid_argument(f"Invalid {source}: {name} must be at least 1, got {getattr(self, name)}")
        if self.batch_timeout_micros < 0:
            raise invalid_argument(
                f"Invalid {source}: batch_timeout_micros cannot be negative, got {self.batch_timeout_micros}"
            )
        sizes = self.allowed_batch_sizes
        if sizes:
            if any(s < 1 for s in sizes) or any(b <= a for a, b in zip(sizes, sizes[1:])):
                raise invalid_argument(
                    f"Invalid {source}: allowed_batch_sizes must be positive and strictly increasing, got {list(sizes)}"
                )
            if sizes[-1] != self.max_batch_size:
                raise invalid_argument(
                    f"Invalid {source}: the last entry of allowed_batch_sizes ({sizes[-1]}) must equal "
                    f"max_batch_size ({self.max_batch_size})"
                )
        return self

    def padded_size(self, size: int) -> int:
        """The smallest allowed batch size that holds ``size`` rows (``size`` itself with none)."""
        for allowed in self.allowed_batch_sizes:
            if allowed >= size:
                return allowed
        return size


_MESSAGE_CLASS = None


def _message_class():
    """tensorflow.serving.BatchingParameters, built once in a private descriptor pool."""
    global _MESSAGE_CLASS
    if _MESSAGE_CLASS is None:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2

        pool = descriptor_pool.DescriptorPool()
        pool.Add(descriptor_pb2.FileDescriptorProto.FromString(wrappers_pb2.DESCRIPTOR.serialized_pb))
        file = descriptor_pb2.FileDescriptorProto(
            name="modelyard_batching.proto",
            package="tensorflow.serving",
            dependency=[wrappers_pb2.DESCRIPTOR.name],
            syntax="proto3",
        )
        msg = file.message_type.add(name="BatchingParameters")
        message, optional, repeated = 11, 1, 3
        for name, number, wrapper in (
            ("max_batch_size", 1, "Int64Value"),
            ("batch_timeout_micros", 2, "Int64Value"),
            ("max_enqueued_batches", 3, "Int64Value"),
            ("num_batch_threads", 4, "Int64Value"),
            ("thread_pool_name", 5, "StringValue"),
        ):
            msg.field.add(name=name, number=number, type=message, label=optional,
                          type_name=f".google.protobuf.{wrapper}")
        msg.field.add(name="allowed_batch_sizes", number=6, type=3, label=repeated)  # int64
        msg.field.add(name="pad_variable_length_inputs", number=7, type=8, label=optional)  # bool
        pool.Add(file)
        _MESSAGE_CLASS = message_factory.GetMessageClass(
            pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters")
        )
    return _MESSAGE_CLASS


def parse_batching_parameters(text: str, source: str = "batching parameters") -> BatchingParams:
    """Text-format BatchingParameters -> checked ``BatchingParams`` (INVALID_ARGUMENT if malformed)."""
    proto = parse_text_proto(text, _message_class()(), source)
    defaults = BatchingParams()
    values = {}
    for name in ("max_batch_size", "batch_timeout_micros", "max_enqueued_batches", "num_batch_threads",
                 "thread_pool_name"):
        values[name] = getattr(proto, name).value if proto.HasField(name) else getattr(defaults, name)
    return BatchingParams(
        **values,
        allowed_batch_sizes=tuple(proto.allowed_batch_sizes),
        pad_variable_length_inputs=proto.pad_variable_length_inputs,
    ).check(source)


def read_batching_parameters(path: str | Path, what: str = "--batching_parameters_file") -> BatchingParams:
    return parse_batching_parameters(read_flag_file(path, what), f"{what} {path}")


@dataclass(frozen=True)
class BatchingPolicy:
    """Which parameters each loaded version batches with (``--enable_batching`` and friends)."""

    params: BatchingParams = field(default_factory=BatchingParams)
    # Honour <version dir>/batching_params.pbtxt (TF Serving's --enable_per_model_batching_params).
    per_version_files: bool = True

    def params_for(self, version_path: Path) -> BatchingParams:
        """The version's own file replaces the global parameters entirely, as in TF Serving."""
        own = Path(version_path) / PER_VERSION_FILE
        if self.per_version_files and own.is_file():
            return read_batching_parameters(own, "per-version batching file")
        return self.params


def policy_from_flags(
    enable_batching: bool, parameters_file: str | Path | None, per_version_files: bool = True
) -> BatchingPolicy | None:
    """The serving flags -> a policy (None: batching off). Reads and checks the global file now."""
    if not enable_batching:
        return None
    params = read_batching_parameters(parameters_file) if parameters_file else BatchingParams()
    return BatchingPolicy(params, per_version_files)
