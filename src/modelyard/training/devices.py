"""Device set-up, applied once per process before any strategy or tensor exists.

Splitting one physical CPU into logical devices is what lets every multi-device
strategy run (and be tested) on a CPU-only machine. GPU options (memory growth, memory
limit, logical GPUs) are validated everywhere but only take effect where TensorFlow
sees a GPU; on a CPU-only host they are reported and skipped.
"""
from __future__ import annotations

import sys
from typing import Any


class DeviceError(RuntimeError):
    """A device option cannot be applied; the message says what to change."""


def _note(message: str) -> None:
    print(f"modelyard train: note: {message}", file=sys.stderr, flush=True)


def _split(name: str) -> tuple[str, int]:
    kind, _, index = name.upper().replace("/DEVICE:", "").lstrip("/").partition(":")
    if kind not in ("CPU", "GPU") or not index.isdigit():
        raise DeviceError(f"devices: bad device name {name!r}; use CPU:0 or GPU:1")
    return kind, int(index)


def configure(options: dict[str, Any]) -> None:
    """Apply ``devices:`` options. Must run before TensorFlow initialises its devices."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    cpus = tf.config.list_physical_devices("CPU")
    try:
        if "visible" in options:
            wanted = [_split(name) for name in options["visible"]]
            chosen = [dev for dev in cpus + gpus for kind, i in wanted if dev.device_type == kind
                      and (cpus if kind == "CPU" else gpus).index(dev) == i]
            if len(chosen) != len(wanted):
                raise DeviceError(f"devices.visible: {options['visible']} not all present; this host has "
                                  f"{len(cpus)} CPU and {len(gpus)} GPU device(s)")
            if not any(dev.device_type == "CPU" for dev in chosen):
                chosen = cpus[:1] + chosen  # TensorFlow always needs its host CPU
            tf.config.set_visible_devices(chosen)
            gpus = [dev for dev in chosen if dev.device_type == "GPU"]
        gpu_keys = [key for key in ("gpu_memory_growth", "gpu_memory_limit_mb", "logical_gpus") if options.get(key)]
        if gpu_keys and not gpus:
            _note(f"{', '.join(gpu_keys)} need a GPU; none is visible here, so they are ignored")
        if gpus and options.get("gpu_memory_growth"):
            for gpu in gpus:
                # Growth and a fixed limit are exclusive in TensorFlow; a limit wins below.
                if not options.get("gpu_memory_limit_mb"):
                    tf.config.experimental.set_memory_growth(gpu, True)
        if gpus and (options.get("gpu_memory_limit_mb") or options.get("logical_gpus")):
            limit = options.get("gpu_memory_limit_mb")
            count = options.get("logical_gpus") or 1
            for gpu in gpus:
                tf.config.set_logical_device_configuration(
                    gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit or 1024) for _ in range(count)]
                )
        if options.get("logical_cpus") and len(tf.config.get_logical_device_configuration(cpus[0]) or [None]) \
                != options["logical_cpus"]:  # already split so (a second job in this process): nothing to do
            tf.config.set_logical_device_configuration(
                cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(options["logical_cpus"])]
            )
    except RuntimeError as exc:
        if isinstance(exc, DeviceError):
            raise
        raise DeviceError(f"devices: {exc} (device options must be set before any TensorFlow op runs)") from exc
    if options.get("log_placement"):
        tf.debugging.set_log_device_placement(True)


def logical_names(kind: str) -> list[str]:
    """``['/device:CPU:0', '/device:CPU:1']`` for the logical devices of ``kind`` now present."""
    import tensorflow as tf

    return [dev.name for dev in tf.config.list_logical_devices(kind)]
