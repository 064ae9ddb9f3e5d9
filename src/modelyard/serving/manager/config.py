"""TF Serving's text-format config files: ModelServerConfig, MonitoringConfig.

ModelServerConfig comes from ``tensorflow-serving-api``'s generated protos. The pip
package lacks MonitoringConfig, so its two fields are read with a small schema here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format

from modelyard.errors import Code, ServingError, invalid_argument
from modelyard.serving.manager import remote_versions
from modelyard.serving.manager.manager import ModelConfig
from modelyard.serving.manager.versions import VersionPolicy
from modelyard.serving.textproto import parse_text_proto, read_flag_file


def parse_model_server_config(text: str, source: str = "model config"):
    from tensorflow_serving.config import model_server_config_pb2

    return parse_text_proto(text, model_server_config_pb2.ModelServerConfig(), source)


def read_model_server_config(path: str | Path):
    flag = "--model_config_file"
    return parse_model_server_config(read_flag_file(path, flag), f"{flag} {path}")


def model_configs(proto) -> list[ModelConfig]:
    """ModelServerConfig -> our ModelConfigs, with TF Serving's checks."""
    if proto.WhichOneof("config") not in (None, "model_config_list"):
        raise ServingError(
            Code.FAILED_PRECONDITION,
            "Cannot transition to requested config. It is only legal to transition from one ModelConfigList to another.",
        )
    configs = []
    for entry in proto.model_config_list.config:
        if not entry.name:
            raise invalid_argument("Every model in the config needs a name")
        if entry.model_platform not in ("", "tensorflow", "tflite"):
            raise invalid_argument(f"Model {entry.name} requests unsupported platform {entry.model_platform}")
        base = os.path.expandvars(entry.base_path)
        if remote_versions.is_remote(base):  # gs://: served from a mirror the poll keeps in step
            problem = remote_versions.requirement(base)
            if problem:
                raise invalid_argument(f"Model {entry.name}: {problem}")
        elif not os.path.isabs(base):
            raise invalid_argument(
                f"Expected model {entry.name} to have an absolute path or URI; got base_path()={entry.base_path}"
            )
        configs.append(
            ModelConfig(
                name=entry.name,
                base_path=base.rstrip("/") if remote_versions.is_remote(base) else Path(base),
                policy=VersionPolicy.from_proto(entry.model_version_policy),
                labels=dict(entry.version_labels),
            )
        )
    return configs


def config_proto(configs: list[ModelConfig]):
    """Our ModelConfigs -> a ModelServerConfig (``model_configs``' inverse): how a change made here
    (V2's repository load/unload) reaches the other worker processes, as a reload does."""
    from tensorflow_serving.config import model_server_config_pb2

    proto = model_server_config_pb2.ModelServerConfig()
    proto.model_config_list.SetInParent()
    for cfg in configs:
        entry = proto.model_config_list.config.add(name=cfg.name, base_path=str(cfg.base_path),
                                                   model_platform="tensorflow")
        policy = entry.model_version_policy
        if cfg.policy.kind == "all":
            policy.all.SetInParent()
        elif cfg.policy.kind == "specific":
            policy.specific.versions.extend(sorted(cfg.policy.versions))
        else:
            policy.latest.num_versions = cfg.policy.num_versions
        for label, version in cfg.labels.items():
            entry.version_labels[label] = version
    return proto


@dataclass(frozen=True)
class MonitoringConfig:
    prometheus_enabled: bool = False
    prometheus_path: str = "/monitoring/prometheus/metrics"


def read_monitoring_config(path: str | Path) -> MonitoringConfig:
    """Parse ``prometheus_config { enable: true path: "..." }`` (tensorflow.serving.MonitoringConfig)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    file = descriptor_pb2.FileDescriptorProto(name="modelyard_monitoring.proto", package="modelyard")
    prom = file.message_type.add(name="PrometheusConfig")
    prom.field.add(name="enable", number=1, type=8, label=1)  # bool
    prom.field.add(name="path", number=2, type=9, label=1)  # string
    top = file.message_type.add(name="MonitoringConfig")
    top.field.add(name="prometheus_config", number=1, type=11, label=1, type_name=".modelyard.PrometheusConfig")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("modelyard.MonitoringConfig"))
    flag = "--monitoring_config_file"
    proto = parse_text_proto(read_flag_file(path, flag), cls(), f"{flag} {path}")
    prometheus = proto.prometheus_config
    return MonitoringConfig(prometheus.enable, prometheus.path or MonitoringConfig.prometheus_path)
