"""Strategy factory: a ``strategy:`` config section -> a ``tf.distribute.Strategy``.

Only this module knows the tf.distribute constructors, so the trainer treats every
strategy alike. Options that need GPUs (NCCL) are refused on CPU-only hosts with a
message naming the CPU alternative, rather than failing deep inside TensorFlow.
"""
from __future__ import annotations

from typing import Any

from modelyard.training import devices as devices_mod


_MULTI_WORKER: dict[str, Any] = {}  # communication -> this process's MultiWorkerMirroredStrategy


class StrategyError(ValueError):
    """The strategy cannot be built as configured; the message says what to change."""


def _device(name: str) -> str:
    kind, index = devices_mod._split(name)
    return f"/device:{kind}:{index}"


def _default_devices() -> list[str]:
    gpus = devices_mod.logical_names("GPU")
    return gpus or devices_mod.logical_names("CPU")


def _check_present(names: list[str]) -> None:
    present = set(devices_mod.logical_names("CPU") + devices_mod.logical_names("GPU"))
    missing = [name for name in names if name not in present]
    if missing:
        raise StrategyError(
            f"strategy: device(s) {', '.join(missing)} do not exist; present: {', '.join(sorted(present))} "
            "(split the CPU with devices.logical_cpus: N)"
        )


def _cross_device_ops(name: str | None, on_gpu: bool):
    import tensorflow as tf

    if name is None:
        return None if on_gpu else tf.distribute.ReductionToOneDevice()
    if name in ("nccl", "hierarchical_copy") and not on_gpu:
        raise StrategyError(f"strategy.cross_device_ops: {name} needs GPUs; on CPU devices use reduce_to_one")
    return {
        "nccl": tf.distribute.NcclAllReduce,
        "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
        "reduce_to_one": tf.distribute.ReductionToOneDevice,
    }[name]()


def _communication(options: dict[str, Any]):
    import tensorflow as tf

    impl = tf.distribute.experimental.CommunicationImplementation
    name = options.get("communication", "auto")
    if name == "nccl" and not tf.config.list_logical_devices("GPU"):
        raise StrategyError("strategy.communication: nccl needs GPUs on every worker; on CPU use ring or auto")
    # No timeout_seconds here: TensorFlow implements it with one thread per collective,
    # which cost a third of the throughput. The trainer's CollectiveWatchdog enforces
    # strategy.collective_timeout instead (see modelyard.training.watchdog).
    return tf.distribute.experimental.CommunicationOptions(
        implementation={"auto": impl.AUTO, "ring": impl.RING, "nccl": impl.NCCL}[name],
    )


def make(options: dict[str, Any]):
    """Build the strategy named by ``options['name']`` (devices must be configured already)."""
    import tensorflow as tf

    name = options.get("name", "default")
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "one_device":
        device = _device(options.get("device", "GPU:0" if devices_mod.logical_names("GPU") else "CPU:0"))
        _check_present([device])
        return tf.distribute.OneDeviceStrategy(device)
    if name == "mirrored":
        names = [_device(d) for d in options["devices"]] if "devices" in options else _default_devices()
        _check_present(names)
        on_gpu = all(":GPU:" in n for n in names)
        return tf.distribute.MirroredStrategy(names, cross_device_ops=_cross_device_ops(options.get("cross_device_ops"), on_gpu))
    if name == "central_storage":
        names = [_device(d) for d in options["compute_devices"]] if "compute_devices" in options else _default_devices()
        param = _device(options["parameter_device"]) if "parameter_device" in options else "/device:CPU:0"
        _check_present(names + [param])
        return tf.distribute.experimental.CentralStorageStrategy(compute_devices=names, parameter_device=param)
    if name == "multi_worker_mirrored":
        # TensorFlow sets up the cluster's collectives once per process: a second job in the
        # same process (several configs trained one after the other) shares the first's strategy.
        key = options.get("communication", "auto")
        if key not in _MULTI_WORKER:
            _MULTI_WORKER[key] = tf.distribute.MultiWorkerMirroredStrategy(communication_options=_communication(options))
        return _MULTI_WORKER[key]
    if name == "parameter_server":
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        num_ps = len(resolver.cluster_spec().as_dict().get("ps", []))
        partitioner = None
        if options.get("num_shards"):
            partitioner = tf.distribute.experimental.partitioners.FixedShardsPartitioner(int(options["num_shards"]))
        elif num_ps > 1:
            # Shard big variables (embeddings, wide dense kernels) across the ps tasks
            # so no single ps holds or serves all of them.
            partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
                min_shard_bytes=int(options.get("min_shard_bytes", 256 << 10)), max_shards=num_ps
            )
        return tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
    raise StrategyError(f"strategy.name: unknown strategy {name!r}")
