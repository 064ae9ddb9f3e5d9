"""The model server process: wires sources, manager, core and both protocol adapters.

Ports open only after the initial models have settled, so a client that can connect
finds them AVAILABLE (TF Serving's readiness rule).
"""
from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable
from concurrent import futures

from modelyard.errors import Code, ServingError
from modelyard.ports import bind_failure
from modelyard.serving.manager import config as config_files
from modelyard.serving.core import ServingCore
from modelyard.serving.protocol.grpc_api import add_services
from modelyard.serving.manager.loader import VersionLoader
from modelyard.serving.manager.manager import Manager, ModelConfig
from modelyard.serving.metrics import ServingMetrics
from modelyard.serving.options import ServeOptions
from modelyard.serving.protocol.rest import RestApp
from modelyard.serving.protocol.v2_repository import Repository

log = logging.getLogger("modelyard.serving")
_GC_THRESHOLD = 10_000  # tracked objects allocated (net) between young-generation collections


def settle_heap_for_serving() -> None:
    """Set the cyclic GC up for serving, once the models are loaded."""
    # TensorFlow leaves ~300k long-lived objects; without the freeze every full collection walks
    # them all, stalling every request for 100+ ms (batched CNN p99 halved, ~15% CPU/req saved).
    gc.collect()
    gc.freeze()
    # A request leaves no reference cycles behind, so collections find nothing to free; at the
    # default threshold (700) the objects of ~64 requests in flight started one every ~10
    # requests, each walking them all. A threshold above what many in-flight requests hold
    # makes them rare; cyclic garbage, if any, waits a little longer.
    gc.set_threshold(_GC_THRESHOLD, *gc.get_threshold()[1:])

RELOAD_WAIT_S = 300.0
CHANGES_POLL_S = 0.1  # --model_config_changes_file is looked at this often (a stat when nothing changed)


def _stat(path) -> tuple | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class ModelServer:
    def __init__(self, options: ServeOptions, group=None):
        self.options = options
        self.group = group  # a WorkerGroup when several worker processes share the ports
        self.metrics = ServingMetrics()
        loader = VersionLoader(self.metrics, self._session_config(), self._warmup_iterations(), options.runtime,
                               batching=options.batching)
        on_demand = None
        if options.load_models_on_demand:
            from modelyard.serving.manager.on_demand import OnDemand

            on_demand = OnDemand(options.model_memory_budget_bytes)
        self.manager = Manager(loader, on_demand=on_demand)
        self.core = ServingCore(self.manager, self.metrics)
        self._stop = threading.Event()
        self._config_text: str | None = None
        self._config_stat: tuple | None = None  # the config file's (inode, size, mtime) when last read
        self._changes = None  # config_changes.ChangesFile of --model_config_changes_file
        if options.model_config_changes_file is not None:
            from modelyard.serving.manager.config_changes import ChangesFile

            self._changes = ChangesFile(options.model_config_changes_file)
        self._reload_lock = threading.Lock()
        self.grpc_server = None  # grpc_h2.LeanGrpcServer or grpc.Server: same start/stop/wait calls
        self._rest_sock = None
        self.rest_app: RestApp | None = None
        # The Open Inference Protocol's model repository extension, over apply_configs (REST and gRPC).
        self.repository = Repository(self.core, self.apply_everywhere)

    def _session_config(self):
        from tensorflow.core.protobuf import config_pb2  # tf.compat.v1.ConfigProto, without TensorFlow's import

        o = self.options
        return config_pb2.ConfigProto(
            intra_op_parallelism_threads=o.tensorflow_intra_op_parallelism,
            inter_op_parallelism_threads=o.tensorflow_inter_op_parallelism,
        )

    def _warmup_iterations(self) -> int:
        return self.options.num_request_iterations_for_warmup if self.options.enable_model_warmup else 0

    # ---- configuration ----------------------------------------------------------------------
    def initial_configs(self) -> list[ModelConfig]:
        o = self.options
        if o.model_config_file:
            self._config_stat = _stat(o.model_config_file)
            self._config_text = o.model_config_file.read_text()
            configs = config_files.model_configs(config_files.read_model_server_config(o.model_config_file))
            return self._with_changes(configs)
        return [ModelConfig(o.model_name, o.model_base_path)]

    def _with_changes(self, configs: list[ModelConfig]) -> list[ModelConfig]:
        """``configs`` (the config file's) with the whole --model_config_changes_file applied on top."""
        if self._changes is None:
            return configs
        from modelyard.serving.manager.config_changes import over_config

        self._changes.restart()
        return over_config(configs, self._changes.read(), self._roots_check())

    def _read_changes(self) -> None:
        """Apply the lines appended to --model_config_changes_file since the last read: only those models."""
        from modelyard.serving.manager.config_changes import loads_ahead, net_changes

        changes = self._changes.read()
        added, removed = net_changes(changes)
        if added or removed:
            self._apply_changes(added, removed)
        if self.manager.on_demand is not None:
            for name in loads_ahead(changes):  # a thread each: a load may wait for room (on_demand.ensure)
                threading.Thread(target=self._load_ahead, args=(name,), name="load-ahead", daemon=True).start()

    def _load_ahead(self, name: str) -> None:
        try:
            self.manager.acquire(name).__exit__(None, None, None)  # loads it as its first request would
        except ServingError as exc:
            log.warning("Could not load model %s ahead: %s", name, exc.message)

    def _roots_check(self) -> Callable[[list[ModelConfig]], object] | None:
        """--model_roots' check of some models (security/paths.py), None without a security flag."""
        if self.options.security is None:
            return None
        from modelyard.serving.security.paths import check_model_paths

        roots = self.options.security.model_roots
        return lambda configs: check_model_paths(configs, roots)

    def _apply_changes(self, added: list[ModelConfig], removed: list[str]) -> None:
        from modelyard.serving.manager.config_changes import admitted

        added = admitted(added, self._roots_check())  # one model outside the roots is skipped
        self.repository.remember(added)
        with self._reload_lock:
            self.manager.update_models(added, removed)
        log.info("Applied --model_config_changes_file: %d model(s) added, %d removed", len(added), len(removed))

    def apply_configs(self, configs: list[ModelConfig], wait_s: float = RELOAD_WAIT_S) -> None:
        """Replace the served models; labels are checked once the versions they name have loaded."""
        self.repository.remember(configs)  # V2's model repository: what a load may bring back
        check = self._roots_check()
        if check is not None:  # the config file's and a reload's models: one outside refuses them all
            check(configs)
        with self._reload_lock:
            allow = self.options.allow_version_labels_for_unavailable_models
            known = set(self.manager.model_names())
            for cfg in configs:  # existing models: refuse bad labels before changing anything
                if cfg.name in known and not allow:
                    self._check_labels(cfg)
            staged = [c if c.name in known else ModelConfig(c.name, c.base_path, c.policy, {}) for c in configs]
            if allow:
                staged = configs
            self.manager.set_models(staged)
            names = [c.name for c in configs]
            self.manager.wait_settled(names, timeout=wait_s)
            failed = [
                f"{{name: {c.name}}}" for c in configs
                if not any(r.state == "AVAILABLE" for r in self.manager.version_states(c.name))
            ] if self.manager.on_demand is None else []  # on demand: nothing loads before its first request
            for cfg in configs:
                if cfg.name not in known and cfg.labels and not allow:
                    self._check_labels(cfg)
                    self.manager.set_labels(cfg.name, cfg.labels)
            if failed:
                raise ServingError(
                    Code.UNKNOWN, f"{len(failed)} model(s) did not become available: {{{', '.join(failed)}}}"
                )

    def _check_labels(self, cfg: ModelConfig) -> None:
        from modelyard.serving.manager.versions import missing_base_path

        for label, version in cfg.labels.items():
            if not self.manager.is_available(cfg.name, version):
                missing = missing_base_path(cfg.base_path, self._path_setting())
                if missing is not None:  # the cause, rather than its consequence for the label
                    raise ServingError(Code.FAILED_PRECONDITION, f"Model {cfg.name}: {missing}")
                raise ServingError(
                    Code.FAILED_PRECONDITION,
                    f"Request to assign label to version {version} of model {cfg.name}, which is not "
                    "currently available for inference",
                )

    def reload_config(self, proto) -> None:
        """ModelService.HandleReloadConfigRequest: applied here and, with workers, by every peer."""
        configs = config_files.model_configs(proto)
        if self.group is None:
            self.apply_configs(configs)
            return
        from google.protobuf import text_format

        generation = self.group.publish_config(text_format.MessageToString(proto))
        try:
            self.apply_configs(configs)
        finally:
            self.group.ack(generation)
        problems = self.group.wait_acks(generation, RELOAD_WAIT_S)
        if problems:
            raise ServingError(Code.UNKNOWN, "Config applied here but not by every worker: " + "; ".join(problems))

    def apply_everywhere(self, configs: list[ModelConfig]) -> None:
        """``apply_configs`` here and, with workers, in every peer (V2's repository load/unload)."""
        if self.group is None:
            self.apply_configs(configs)
        else:
            self.reload_config(config_files.config_proto(configs))

    def _sync_with_group(self) -> None:
        """Apply a config another worker received; publish this worker's metrics."""
        pending = self.group.pending_config()
        if pending is not None:
            generation, text = pending
            error = ""
            try:
                self.apply_configs(config_files.model_configs(config_files.parse_model_server_config(text)))
            except ServingError as exc:
                error = exc.message
            self.group.ack(generation, error)
        self.group.write_metrics(self.metrics.snapshot())

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        o = self.options
        configs = self.initial_configs()
        log.info("Loading %d model(s): %s", len(configs), ", ".join(c.name for c in configs))
        try:
            self.apply_configs(configs, wait_s=None)
        except ServingError as exc:
            if exc.code == Code.FAILED_PRECONDITION:
                raise
            self._report_unavailable(configs)
        threading.Thread(target=self._poll_loop, name="source-poll", daemon=True).start()
        self.grpc_server = self._grpc_server()
        self._rest_sock = self._rest_socket() if o.rest_api_port else None
        self.grpc_server.start()
        log.info("Running gRPC ModelServer at %s:%d ...", o.host, o.port)
        metrics_path = None
        if o.monitoring_config_file:
            monitoring = config_files.read_monitoring_config(o.monitoring_config_file)
            if monitoring.prometheus_enabled:
                metrics_path = monitoring.prometheus_path
        self.rest_app = RestApp(
            self.core,
            threads=o.rest_api_num_threads,
            timeout_ms=o.rest_api_timeout_in_ms,
            max_body_bytes=o.rest_api_max_body_bytes,
            cors=o.rest_api_enable_cors_support,
            metrics_path=metrics_path,
            peer_metrics=self.group.peer_metrics if self.group else None,
            json_numbers=o.json_numbers,
        )
        if o.console:
            from modelyard.web.console import Console

            self.rest_app.console = Console(self, o.console_token)
        self.rest_app.v2.repository = self.repository

    def _path_setting(self) -> str:
        """Where the user wrote a model's base path: the config file's field, or the flag."""
        return "base_path:" if self.options.model_config_file else "--model_base_path"

    def _report_unavailable(self, configs: list[ModelConfig]) -> None:
        """After a start where some models did not load: say why for each, and stop when nothing can serve.

        A model whose base path has no versions yet can still become available (an export lands
        in it), as in TF Serving; one whose versions failed to load, or whose base path is a
        model itself, cannot, so with no other model to serve the server must not run empty.
        """
        from modelyard.serving.manager.versions import misplaced_model, missing_base_path, version_dirs

        setting = self._path_setting()
        serving, waiting, reasons = [], [], []
        for cfg in configs:
            records = self.manager.version_states(cfg.name)
            if any(r.state == "AVAILABLE" for r in records):
                serving.append(cfg.name)
            elif (mistake := misplaced_model(cfg.base_path, setting)) is not None:
                reasons.append(f"model {cfg.name}: {mistake}")
            elif (missing := missing_base_path(cfg.base_path, setting)) is not None:
                waiting.append(cfg.name)  # as TF Serving, which polls for it: an export may create it
                log.warning("Model %s: %s; waiting for a version in it, e.g. modelyard.export(model, %r)",
                            cfg.name, missing, str(cfg.base_path))
            elif not version_dirs(cfg.base_path, cfg.policy):  # a gs:// one: only what the policy serves
                waiting.append(cfg.name)
                log.warning("Model %s has no versions under %s yet (integer-named directories such as 1 or "
                            "0001): waiting for one, e.g. modelyard.export(model, %r)",
                            cfg.name, cfg.base_path, str(cfg.base_path))
            else:
                failures = "; ".join(f"version {r.version}: {r.error.message}" for r in records if r.error)
                reasons.append(f"model {cfg.name} could not load ({failures or 'no version was chosen by its policy'})")
        if reasons and not serving and not waiting:
            raise ServingError(Code.UNKNOWN, "no model can be served: " + "; ".join(reasons))
        for reason in reasons:
            log.error("%s", reason)
        if reasons:
            log.error("Serving %s; the status API shows each version's error",
                      ", ".join(serving) if serving else f"nothing yet (waiting for {', '.join(waiting)})")

    def _grpc_server(self):
        """The gRPC server, bound but not started: the lean one, or grpcio's (--grpc_implementation)."""
        o = self.options
        from modelyard.model.tensor_proto import set_max_decoded_bytes
        from modelyard.serving.security.grpcio_server import grpcio_interceptors

        if o.security is not None:
            set_max_decoded_bytes(o.security.max_decoded_tensor_bytes)
        if o.grpc_implementation == "lean":
            from modelyard.serving.transport.grpc_h2 import LeanGrpcServer
            from modelyard.serving.transport.secure_h2 import grpc_guard

            server = LeanGrpcServer(self.core, self.reload_config, o.host, o.port, max_threads=o.grpc_max_threads,
                                    max_receive_bytes=o.grpc_max_receive_message_bytes,
                                    reuse_port=self.group is not None, guard=grpc_guard(o.security),
                                    repository=self.repository)
            server.bind()
            return server
        import grpc

        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=o.grpc_max_threads, thread_name_prefix="grpc"),
            interceptors=grpcio_interceptors(o.security),
            options=[
                ("grpc.max_send_message_length", 2**31 - 1),
                ("grpc.max_receive_message_length", o.grpc_max_receive_message_bytes),
                # Workers share the port; a single server must fail loudly if the port is taken.
                ("grpc.so_reuseport", 1 if self.group else 0),
            ],
        )
        add_services(server, self.core, self.reload_config, self.repository)
        from modelyard.serving.security.grpcio_server import bind_grpcio

        if bind_grpcio(server, f"{o.host}:{o.port}", o.security) == 0:
            raise OSError(f"cannot bind gRPC port {o.host}:{o.port}: is another server running? Use --port")
        return server

    def _poll_loop(self) -> None:
        o = self.options
        fs_interval = o.file_system_poll_wait_seconds
        config_interval = o.model_config_file_poll_wait_seconds if o.model_config_file else 0
        if fs_interval <= 0 and config_interval <= 0 and self.group is None and self._changes is None:
            return
        tick = min([i for i in (fs_interval, config_interval) if i > 0] + ([1] if self.group else []) +
                   ([CHANGES_POLL_S] if self._changes is not None else []))
        next_fs = next_config = time.monotonic()
        while not self._stop.wait(tick):
            now = time.monotonic()
            try:
                if self.group is not None:
                    self._sync_with_group()
                if config_interval > 0 and now >= next_config + config_interval:
                    next_config = now
                    self._reread_config_file()
                if self._changes is not None:
                    self._read_changes()
                if fs_interval > 0 and now >= next_fs + fs_interval - 0.01:
                    next_fs = now
                    self.manager.poll()
            except Exception:  # polling must survive a bad config edit or a vanished directory
                log.exception("Polling failed; will try again")

    def _reread_config_file(self) -> None:
        stat = _stat(self.options.model_config_file)
        if stat == self._config_stat:  # not even read: a thousand models' file is not free to parse
            return
        self._config_stat = stat
        text = self.options.model_config_file.read_text()
        if text == self._config_text:
            return
        self._config_text = text
        try:
            self.apply_configs(self._with_changes(
                config_files.model_configs(config_files.parse_model_server_config(text))))
            log.info("Applied the changed --model_config_file")
        except ServingError as exc:
            log.error("Changed --model_config_file not fully applied: %s", exc.message)

    def serve_rest_forever(self) -> None:
        """Run the REST API in this thread until SIGINT/SIGTERM; then stop everything."""
        o = self.options
        try:
            settle_heap_for_serving()
            if o.rest_api_port:
                from modelyard.serving.transport import response_writer
                from modelyard.serving.protocol import rest_json
                from modelyard.serving.transport.http_server import serve
                from modelyard.serving.transport.secure_http import rest_guard

                missing = [what for what, built in (("the numeric body reader", rest_json._numjson),
                                                    ("the answer writer", response_writer.send_many)) if built is None]
                if missing:
                    log.warning("The REST server's C extensions were not built (no C compiler at install): %s. "
                                "It serves the same answers through slower pure-Python paths. Install a C "
                                "compiler and reinstall modelyard to build them.", " and ".join(missing))
                log.info("Exporting HTTP/REST API at:%s:%d ...", o.host, o.rest_api_port)
                serve(self.rest_app, self._rest_sock, rest_guard(o.security))
            else:
                self.grpc_server.wait_for_termination()
        finally:
            self.stop()

    def _rest_socket(self):
        import socket

        o = self.options
        family = socket.AF_INET6 if ":" in o.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self.group is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind((o.host, o.rest_api_port))
        except OSError as exc:
            sock.close()
            raise bind_failure(exc, "REST", o.host, o.rest_api_port) from None
        sock.listen(2048)
        sock.set_inheritable(True)
        return sock

    def stop(self) -> None:
        self._stop.set()
        if self.grpc_server is not None:
            self.grpc_server.stop(grace=2)
        self.manager.shutdown()
