"""``modelyard serve`` flags: TF Serving's names and defaults, checked for contradictions up front."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path


# A request waiting for its batch holds a worker thread, so with batching the pools must hold
# several full batches of waiters, or batches never grow past the pool size.
BATCHING_MIN_THREADS = 128


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    flag = dict(type=_bool, nargs="?", const=True, default=False, metavar="BOOL")
    add("--port", type=int, default=8500, help="gRPC port (default 8500)")
    add("--rest_api_port", type=int, default=8501, help="REST port (default 8501; 0 disables REST)")
    add("--host", default="0.0.0.0", help="address to bind both ports to (default 0.0.0.0)")
    add("--model_name", default=None, help="name of the single model to serve (default 'default')")
    add("--model_base_path", default=None, help="base path of the single model: holds version dirs 1, 2, ... "
        "(a local directory, or gs://bucket/path in the storage STORAGE_EMULATOR_HOST names)")
    add("--model_config_file", default=None, help="text ModelServerConfig naming several models")
    add("--model_config_file_poll_wait_seconds", type=int, default=0,
        help="re-read --model_config_file this often (0: read once)")
    add("--model_config_changes_file", default=None,
        help="a journal of changes to --model_config_file, one JSON line each ({\"add\": NAME, \"base_path\": PATH} "
        "or {\"remove\": NAME}), read from where it stopped every 0.1 s (serving/manager/config_changes.py); "
        "a relative path is taken from the config file's directory")
    add("--file_system_poll_wait_seconds", type=int, default=1,
        help="look for new versions this often (0: once at start)")
    add("--allow_version_labels_for_unavailable_models", **flag,
        help="allow labels to point at versions that are not loaded yet")
    add("--monitoring_config_file", default=None, help="text MonitoringConfig (enables Prometheus metrics)")
    add("--rest_api_enable_cors_support", **flag, help="send CORS headers on REST responses")
    add("--rest_api_timeout_in_ms", type=int, default=30000, help="REST request timeout (default 30000; 0: none)")
    add("--rest_api_num_threads", type=int, default=0,
        help=f"REST worker threads (default: 4 per core; with --enable_batching at least {BATCHING_MIN_THREADS})")
    add("--rest_api_max_body_bytes", type=int, default=256 * 1024 * 1024,
        help="largest REST request body accepted, in bytes (default 256 MiB)")
    add("--workers", type=int, default=1,
        help="server processes sharing both ports, to use every core (default 1; 0: one per core)")
    add("--grpc_max_threads", type=int, default=0,
        help=f"gRPC worker threads (default: 4 per core; with --enable_batching at least {BATCHING_MIN_THREADS})")
    add("--grpc_implementation", choices=("lean", "grpcio"), default="lean",
        help="gRPC server: lean (modelyard's own HTTP/2 server, several times less CPU per call; default) "
        "or grpcio (the grpcio library's server)")
    add("--grpc_max_receive_message_bytes", type=int, default=2**31 - 1,
        help="largest gRPC request message accepted, in bytes (default 2 GiB - 1, as TF Serving)")
    add("--enable_model_warmup", type=_bool, nargs="?", const=True, default=True, metavar="BOOL",
        help="replay assets.extra/tf_serving_warmup_requests before serving a version (default true)")
    add("--num_request_iterations_for_warmup", type=int, default=1, help="times each warmup record is replayed")
    add("--console", type=_bool, nargs="?", const=True, default=True, metavar="BOOL",
        help="serve the console at /console on the REST port (default true)")
    add("--console_token_file", default=None, metavar="FILE",
        help="file holding the token that enables console actions (else $MODELYARD_CONSOLE_TOKEN; none: read-only)")
    add("--runtime", choices=("auto", "tensorflow", "litert", "graph"), default="auto",
        help="how SavedModel signatures run: auto (LiteRT where it gives TensorFlow's numbers, else "
        "TensorFlow; the graph runtime where TensorFlow is not installed), tensorflow, litert (fail the load if a "
        "signature cannot run on LiteRT), or graph (NumPy kernels, no TensorFlow: what the slim serving image runs)")
    add("--json_numbers", choices=("tf_serving", "vertex"), default="tf_serving",
        help="how REST JSON numbers reach integer inputs: tf_serving (default: a number written with a "
        "fraction or exponent, even 0.0, is refused, as TF Serving does) or vertex (integral numbers such as "
        "0.0 or 1e2 are integers, as Vertex AI's prediction service hands them to a container; 0.5 is still "
        "refused). The platform starts its replicas with vertex")
    add("--tensorflow_intra_op_parallelism", type=int, default=0, help="TF intra-op threads (0: TF decides)")
    add("--tensorflow_inter_op_parallelism", type=int, default=0,
        help="TF inter-op threads (0: TF decides; -1: each call runs its ops in the calling thread)")
    add("--enable_batching", **flag, help="merge concurrent requests for a model into batches")
    add("--batching_parameters_file", default=None,
        help="text BatchingParameters for --enable_batching (default: TF Serving's defaults)")
    add("--enable_per_model_batching_params", type=_bool, nargs="?", const=True, default=True, metavar="BOOL",
        help="a version's own batching_params.pbtxt replaces --batching_parameters_file (default true)")
    add("--load_models_on_demand", **flag,
        help="load each model of the config on its first request, not at start; with --model_memory_budget_bytes, "
        "unload the least recently used ones to make room (modelyard's deployment resource pools run so)")
    add("--model_memory_budget_bytes", type=int, default=0,
        help="with --load_models_on_demand: the model file bytes kept loaded at most (0: no budget)")
    from modelyard.serving.security import options as security  # TLS, tokens, limits (issue 19)

    security.add_flags(parser, _bool)


@dataclass
class ServeOptions:
    port: int
    rest_api_port: int
    host: str
    model_name: str | None
    model_base_path: Path | str | None  # str: a gs:// URI (serving/manager/remote_versions.py)
    model_config_file: Path | None
    model_config_file_poll_wait_seconds: int
    file_system_poll_wait_seconds: int
    allow_version_labels_for_unavailable_models: bool
    monitoring_config_file: Path | None
    rest_api_enable_cors_support: bool
    rest_api_timeout_in_ms: int
    rest_api_num_threads: int
    rest_api_max_body_bytes: int
    grpc_max_threads: int
    enable_model_warmup: bool
    num_request_iterations_for_warmup: int
    tensorflow_intra_op_parallelism: int
    tensorflow_inter_op_parallelism: int
    runtime: str = "auto"
    grpc_implementation: str = "lean"
    grpc_max_receive_message_bytes: int = 2**31 - 1
    workers: int = 1
    use_demo: bool = False
    batching: object = None  # a batching_config.BatchingPolicy when --enable_batching
    security: object = None  # a security.options.SecurityOptions
    console: bool = True
    console_token: str | None = None
    json_numbers: str = "tf_serving"  # dtypes.JSON_NUMBER_RULES: how JSON numbers meet integer inputs
    load_models_on_demand: bool = False  # serving/manager/on_demand.py
    model_memory_budget_bytes: int = 0
    model_config_changes_file: Path | None = None  # serving/manager/config_changes.py


class OptionsError(ValueError):
    """A contradictory or impossible combination of flags; the message says how to fix it."""


def _environment_source(environ, model_name_flag: str | None) -> str:
    """What to fix when the base path came from TF Serving's variables: the ones the user set."""
    given = [f"{var}={environ[var]}" for var in ("MODEL_BASE_PATH", "MODEL_NAME") if var in environ]
    if model_name_flag:
        given.append(f"--model_name {model_name_flag}")
    defaults = [f"{var} is unset (default {default})" for var, default in (("MODEL_BASE_PATH", "/models"),
                ("MODEL_NAME", "model")) if var not in environ and not (var == "MODEL_NAME" and model_name_flag)]
    return (f"{' / '.join(given)} (the base path is $MODEL_BASE_PATH/$MODEL_NAME, as in TF Serving's image"
            + (f"; {', '.join(defaults)}" if defaults else "") + ")")


def resolve(args: argparse.Namespace, environ=os.environ) -> ServeOptions:
    """Flags (and TF Serving's MODEL_NAME / MODEL_BASE_PATH variables) -> checked options."""
    model_name, base_path = args.model_name, args.model_base_path
    if args.model_config_file and (model_name or base_path):
        raise OptionsError(
            "--model_config_file names the models itself: drop --model_name/--model_base_path, "
            "or drop --model_config_file to serve one model"
        )
    use_demo = False
    base_path_source = "--model_base_path"  # what the user typed, for the error below
    if not args.model_config_file and not base_path:
        if "MODEL_BASE_PATH" in environ or "MODEL_NAME" in environ:
            # As in TF Serving's Docker image: ${MODEL_BASE_PATH}/${MODEL_NAME}.
            model_name = model_name or environ.get("MODEL_NAME", "model")
            base_path = os.path.join(environ.get("MODEL_BASE_PATH", "/models"), model_name)
            base_path_source = _environment_source(environ, args.model_name)
        elif model_name:
            raise OptionsError(f"--model_name {model_name} needs --model_base_path (the directory of its versions)")
        else:
            use_demo = True
    remote = bool(base_path) and "://" in str(base_path)  # Path() would make gs://b/m the local gs:/b/m
    if remote:
        from modelyard.serving.manager.remote_versions import requirement

        problem = requirement(str(base_path), environ)
        if problem:
            raise OptionsError(f"{problem} (fix {base_path_source})")
    if base_path and not remote and not Path(base_path).is_dir():
        raise OptionsError(
            f"model base path {base_path} is not a directory: export a model there first "
            f"(modelyard.export(model, path)) or fix {base_path_source}"
        )
    if base_path and not remote:
        from modelyard.serving.manager.versions import misplaced_model

        mistake = misplaced_model(Path(base_path))
        if mistake:
            came_from = "" if base_path_source == "--model_base_path" else f" (it came from {base_path_source})"
            raise OptionsError(mistake + came_from)
    if args.model_config_file and not Path(args.model_config_file).is_file():
        raise OptionsError(f"--model_config_file {args.model_config_file} does not exist")
    if args.monitoring_config_file and not Path(args.monitoring_config_file).is_file():
        raise OptionsError(f"--monitoring_config_file {args.monitoring_config_file} does not exist")
    if args.batching_parameters_file and not args.enable_batching:
        raise OptionsError("--batching_parameters_file only applies with --enable_batching: add it or drop the file")
    from modelyard.errors import ServingError
    from modelyard.serving.batching.config import policy_from_flags

    try:  # read the file now so a malformed one stops the server before it starts
        batching = policy_from_flags(args.enable_batching, args.batching_parameters_file,
                                     args.enable_per_model_batching_params)
    except ServingError as exc:
        raise OptionsError(exc.message) from None
    for flag in ("port", "rest_api_port"):
        value = getattr(args, flag)
        if not 0 <= value <= 65535:
            raise OptionsError(f"--{flag} must be between 0 and 65535, got {value}")
    if args.port == 0:
        raise OptionsError("--port must be a real port: the gRPC API is always served")
    if args.model_memory_budget_bytes and not args.load_models_on_demand:
        raise OptionsError("--model_memory_budget_bytes only applies with --load_models_on_demand: add it or drop "
                           "the budget")
    if args.model_config_changes_file and not args.model_config_file:
        raise OptionsError("--model_config_changes_file changes a --model_config_file: give one")
    if args.rest_api_port and args.rest_api_port == args.port:
        raise OptionsError(f"--rest_api_port and --port are both {args.port}: give them different ports")
    for flag in ("workers", "rest_api_timeout_in_ms", "rest_api_num_threads", "rest_api_max_body_bytes", "grpc_max_threads",
                 "grpc_max_receive_message_bytes", "model_config_file_poll_wait_seconds", "num_request_iterations_for_warmup",
                 "model_memory_budget_bytes"):
        if getattr(args, flag) < 0:
            raise OptionsError(f"--{flag} cannot be negative")
    from modelyard.serving.security import options as security

    try:
        security_options = security.resolve(args)
    except ValueError as exc:
        raise OptionsError(str(exc)) from None
    if args.console_token_file and not Path(args.console_token_file).is_file():
        raise OptionsError(f"--console_token_file {args.console_token_file} does not exist")
    console_token = (Path(args.console_token_file).read_text().strip() if args.console_token_file
                     else environ.get("MODELYARD_CONSOLE_TOKEN")) or None
    cores = os.cpu_count() or 1
    default_threads = max(4 * cores, BATCHING_MIN_THREADS) if args.enable_batching else 4 * cores
    return ServeOptions(
        port=args.port,
        rest_api_port=args.rest_api_port,
        host=args.host,
        model_name=model_name or ("my_mnist_model" if use_demo else "default"),
        model_base_path=(str(base_path).rstrip("/") if remote else Path(base_path).resolve()) if base_path else None,
        model_config_file=Path(args.model_config_file).resolve() if args.model_config_file else None,
        model_config_file_poll_wait_seconds=args.model_config_file_poll_wait_seconds,
        file_system_poll_wait_seconds=args.file_system_poll_wait_seconds,
        allow_version_labels_for_unavailable_models=args.allow_version_labels_for_unavailable_models,
        monitoring_config_file=Path(args.monitoring_config_file) if args.monitoring_config_file else None,
        rest_api_enable_cors_support=args.rest_api_enable_cors_support,
        rest_api_timeout_in_ms=args.rest_api_timeout_in_ms,
        rest_api_num_threads=args.rest_api_num_threads or default_threads,
        rest_api_max_body_bytes=args.rest_api_max_body_bytes,
        grpc_max_threads=args.grpc_max_threads or default_threads,
        enable_model_warmup=args.enable_model_warmup,
        num_request_iterations_for_warmup=args.num_request_iterations_for_warmup,
        tensorflow_intra_op_parallelism=args.tensorflow_intra_op_parallelism,
        tensorflow_inter_op_parallelism=args.tensorflow_inter_op_parallelism,
        runtime=args.runtime,
        grpc_implementation=args.grpc_implementation,
        grpc_max_receive_message_bytes=args.grpc_max_receive_message_bytes,
        workers=args.workers or cores,
        use_demo=use_demo,
        batching=batching,
        security=security_options,
        console=args.console,
        console_token=console_token,
        json_numbers=args.json_numbers,
        load_models_on_demand=args.load_models_on_demand,
        model_memory_budget_bytes=args.model_memory_budget_bytes,
        # A relative journal is beside the config file it changes.
        model_config_changes_file=(Path(args.model_config_file).resolve().parent / args.model_config_changes_file)
        if args.model_config_changes_file else None,
    )
