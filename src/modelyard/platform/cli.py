"""``modelyard platform``: run the control plane (Vertex AI REST API, gateway, replica supervisor)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from modelyard.cli_parser import examples
from modelyard.platform.api import http_limits, job_tokens
from modelyard.ports import bind_error, exit_status


def register(subparsers) -> None:
    from modelyard.platform import client_cli

    client_cli.register(subparsers)  # modelyard models ... / modelyard endpoints ...
    parser = subparsers.add_parser(
        "platform",
        help="run the Vertex-AI-compatible control plane: models, endpoints, traffic splits, replicas",
        description="Serve Vertex AI's v1 REST API for models and endpoints; deployed models run as "
        "`modelyard serve` replica processes behind a gateway.",
        epilog=examples(
            "modelyard platform --port 8600 --artifact-root models     # from the folder holding models/",
            "modelyard platform --store postgresql+psycopg://user@db/platform --auth-token s3cret",
            "modelyard platform --engine ray --ray-address 10.0.0.1:6379",
            "modelyard platform stop --port 8600   # stop it with its replicas and jobs",
        ),
    )
    parser.add_argument("action", nargs="?", choices=["stop"],
                        help="stop: ask the platform at --host/--port to cancel its jobs, stop its replicas and "
                        "exit (a plain Ctrl-C or SIGTERM leaves them running, for the next start to adopt)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8600, help="port of the API and gateway (default 8600)")
    parser.add_argument("--store", default=None,
                        help="SQLite file (default ~/.local/share/modelyard/platform.db) or a "
                        "postgresql://... URL shared by several platform processes")
    parser.add_argument("--state-dir", default=None,
                        help="where replica logs and model links go (default: beside the SQLite store)")
    parser.add_argument("--artifact-root", action="append", default=[], metavar="DIR|gs://BUCKET/PREFIX",
                        help="only artifact URIs inside this directory (relative: to the working directory; it "
                        "must exist) or object-storage prefix are accepted (repeatable; default: any)")
    parser.add_argument("--auth-token", default=os.environ.get("MODELYARD_PLATFORM_TOKEN"),
                        help="require 'Authorization: Bearer TOKEN' on the control API "
                        "(default: $MODELYARD_PLATFORM_TOKEN; unset: no token)")
    parser.add_argument("--auth-predict", action="store_true", help="require the token on predict routes too")
    parser.add_argument("--console", action=argparse.BooleanOptionalAction, default=True,
                        help="serve the console at /console (default on; actions need --auth-token)")
    parser.add_argument("--tls-cert", default=None, metavar="PEM",
                        help="serve the API and gateway over HTTPS with this certificate (chain) file")
    parser.add_argument("--tls-key", default=None, metavar="PEM", help="the private key of --tls-cert")
    parser.add_argument("--tls-client-ca", default=None, metavar="PEM",
                        help="mutual TLS: only clients with a certificate signed by this CA get in")
    parser.add_argument("--storage-port", type=int, default=None,
                        help="port of the Cloud Storage JSON API the platform serves (default: --port + 1, "
                        "i.e. 8601); unused when STORAGE_EMULATOR_HOST is already set (that storage is used)")
    parser.add_argument("--storage-root", default=None, metavar="DIR",
                        help="where the served objects are files: gs://BUCKET/NAME is DIR/BUCKET/NAME "
                        "(default: STATE_DIR/storage)")
    parser.add_argument("--max-replicas", type=int, default=8, help="largest max_replica_count accepted")
    parser.add_argument("--upstream-deadline-min-seconds", type=float, default=1.0, metavar="S",
                        help="a predict's first attempt waits for its replica at least this long (default 1)")
    parser.add_argument("--upstream-deadline-factor", type=float, default=10.0, metavar="K",
                        help="... and up to K times the slowest of the model's last 256 answers, then it is "
                             "retried on another replica (default 10)")
    parser.add_argument("--upstream-timeout-seconds", type=float, default=120.0, metavar="S",
                        help="the longest any attempt waits, retries included (default 120)")
    parser.add_argument("--readiness-deadline-seconds", type=float, default=1.0, metavar="S",
                        help="a replica whose model status does not answer within S (probed every second) "
                             "is taken out of routing (default 1)")
    parser.add_argument("--replace-unready-after-seconds", type=float, default=5.0, metavar="S",
                        help="a replica unready this long is stopped and replaced (default 5)")
    http_limits.add_arguments(parser)  # the API's and the storage's ports, as modelyard serve's flags
    parser.add_argument("--max-request-bytes", type=int, default=4 * 1024 * 1024, metavar="N",
                        help="largest control-plane request body, refused (413) before it is read whole "
                             "(default 4 MiB); predict bodies: --max-predict-bytes")
    parser.add_argument("--max-predict-bytes", type=int, default=10 * 1024 * 1024, metavar="N",
                        help="largest predict body, refused (413) at the gateway before it is read whole and "
                             "at each replica (its --rest_api_max_body_bytes): a replica holds about ten times "
                             "the body while it parses it (default 10 MiB, Vertex's dedicated endpoint limit)")
    parser.add_argument("--job-max-processes", type=int, default=None, metavar="N",
                        help="tasks (processes and threads) one job may run, by a cgroup where the platform "
                             "may make one, else RLIMIT_NPROC (default max(4096, 256 x CPUs); 0: no limit)")
    parser.add_argument("--job-max-memory-bytes", type=int, default=None, metavar="N",
                        help="memory one job may use, by a cgroup, else RLIMIT_AS per process "
                             "(default 80%% of this machine's memory; 0: no limit)")
    parser.add_argument("--job-max-file-bytes", type=int, default=None, metavar="N",
                        help="largest file a job's process may write (RLIMIT_FSIZE; default half the free "
                             "space of the state directory's disk at start, at least 1 GiB; 0: no limit)")
    parser.add_argument("--replica-arg", action="append", default=[],
                        help="extra flag passed to every `modelyard serve` replica (repeatable), "
                        "e.g. --replica-arg=--runtime=tensorflow")
    parser.add_argument("--engine", choices=["local", "ray"], default="local",
                        help="where replicas run: 'local' processes on this host (default), or actors on a "
                        "Ray cluster ('ray', with --ray-address), placed across its nodes")
    parser.add_argument("--ray-address", default=os.environ.get("RAY_ADDRESS", ""),
                        help="the Ray cluster's head (GCS) address HOST:PORT, as `ray start --head` prints it "
                        "(default: $RAY_ADDRESS)")
    parser.add_argument("--ray-replica-cpus", type=float, default=1.0,
                        help="CPUs Ray reserves for each replica actor (default 1)")
    parser.add_argument("--no-warm-spare", dest="warm_spare", action="store_false",
                        help="local engine: do not keep a spare `modelyard serve` running (TensorFlow imported) "
                        "for the next replica; replicas then take seconds longer to start")
    parser.add_argument("--autoscale-target-in-flight", type=float, default=4.0,
                        help="requests in flight per replica the autoscaler aims at (default 4)")
    parser.add_argument("--autoscale-up-seconds", type=float, default=3.0,
                        help="how long the load must call for more replicas before one starts (default 3)")
    parser.add_argument("--autoscale-cooldown-seconds", type=float, default=60.0,
                        help="how long the load must call for fewer replicas before one drains (default 60)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from modelyard.platform.app import Config, Platform
    from modelyard.platform.dataplane.autoscale import Policy
    from modelyard.platform.dataplane.deadlines import DeadlinePolicy
    from modelyard.platform.dataplane.supervisor import Readiness
    from modelyard.platform.state.store import database_url, default_store_path

    if args.action == "stop":
        return _stop_platform(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    from modelyard.platform.resources.artifacts import allowed_roots

    try:  # before anything is made: a root that does not exist stops the start
        roots = allowed_roots(args.artifact_root)
    except ValueError as exc:
        print(f"modelyard platform: error: {exc}", file=sys.stderr)
        return 2
    url = database_url(args.store)
    if args.state_dir:
        state_dir = Path(args.state_dir)
    elif url.startswith("sqlite:///"):
        state_dir = Path(url[len("sqlite:///"):]).parent / "platform-state"
    else:
        state_dir = default_store_path().parent / "platform-state"
    from modelyard.platform.private_state import SharedStateDir, make_private

    try:
        make_private(state_dir, url)  # 0700 / 0600, and umask 077 for everything made from here on
    except SharedStateDir as exc:
        print(f"modelyard platform: error: {exc}", file=sys.stderr)
        return 2
    config = Config(store_url=url, state_dir=state_dir.resolve(), host=args.host, port=args.port,
                    artifact_roots=roots,
                    auth_token=args.auth_token or None, auth_predict=args.auth_predict, console=args.console,
                    max_replicas=args.max_replicas,
                    replica_args=[f"--rest_api_max_body_bytes={args.max_predict_bytes}", *args.replica_arg],
                    max_predict_bytes=args.max_predict_bytes,
                    autoscale=Policy(args.autoscale_target_in_flight, args.autoscale_up_seconds,
                                     args.autoscale_cooldown_seconds),
                    engine=args.engine, ray_address=args.ray_address, ray_replica_cpus=args.ray_replica_cpus,
                    warm_spare=args.warm_spare, max_request_bytes=args.max_request_bytes,
                    upstream_deadline=DeadlinePolicy(args.upstream_deadline_min_seconds,
                                                     args.upstream_deadline_factor, args.upstream_timeout_seconds),
                    readiness=Readiness(deadline_s=args.readiness_deadline_seconds,
                                        replace_after_s=args.replace_unready_after_seconds))
    from modelyard.platform.jobs.job_limits import JobLimits, default_limits

    defaults = default_limits(state_dir)
    config.job_limits = JobLimits(*(given if given is not None else default for given, default in (
        (args.job_max_processes, defaults.max_processes), (args.job_max_memory_bytes, defaults.max_memory_bytes),
        (args.job_max_file_bytes, defaults.max_file_bytes))))
    config.storage_root = None if os.environ.get(STORAGE_ENV) else \
        Path(args.storage_root or state_dir / "storage").expanduser().resolve()
    try:
        tls = _tls_context(args.tls_cert, args.tls_key, args.tls_client_ca)
    except (OSError, ValueError) as exc:
        print(f"modelyard platform: error: {exc}", file=sys.stderr)
        return 2
    # What every job gets (jobs/job_identity): where live job tokens are marked (the storage process reads
    # them too, so before it starts) and the platform's URL (the SDK's default endpoint in a job).
    os.environ[job_tokens.DIR_ENV] = str(config.state_dir / "job-tokens")
    os.environ["MODELYARD_PLATFORM"] = f"{'https' if tls else 'http'}://{_client_host(args.host)}:{args.port}"
    try:  # before anything that starts or connects to children (Ray's runtime_env is set at connect)
        storage = _start_storage(config, args, "https" if tls else "http")
    except OSError as exc:
        print(f"modelyard platform: error: cannot serve Cloud Storage: {exc}", file=sys.stderr)
        return exit_status(bind_error(exc, str(exc)))  # PORT_TAKEN_EXIT: whoever started us picks other ports
    from modelyard.platform.resources.artifacts import check_remote_buckets

    try:  # a gs:// or s3:// root whose bucket is missing stops the start, as a missing local one does
        for note in check_remote_buckets(roots, config.storage_url if config.storage_root else None):
            print(f"modelyard platform: {note}", flush=True)
    except ValueError as exc:
        print(f"modelyard platform: error: {exc}", file=sys.stderr)
        _stop(storage)
        return 2
    if args.engine == "ray":
        from modelyard.platform.dataplane.replicas_ray import EngineUnavailable, connect

        try:
            connect(args.ray_address)  # before serving: a wrong address stops the start, it does not hang
        except EngineUnavailable as exc:
            print(f"modelyard platform: error: {exc}", file=sys.stderr)
            _stop(storage)
            return 2
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    scheme = "https" if tls else "http"
    print(f"modelyard platform: store {url.split('@')[-1]}, API on {scheme}://{args.host}:{args.port}", flush=True)
    print("modelyard platform: " + (f"artifact URIs are accepted only under {', '.join(roots)} (--artifact-root)"
                                    if roots else "artifact URIs are accepted anywhere (no --artifact-root)")
          + f"; relative ones are read from {Path.cwd()}", flush=True)
    try:
        asyncio.run(_serve(Platform(config), args.host, args.port, tls, storage, _api_limits(args),
                           (args.tls_cert, args.tls_key, args.tls_client_ca)))
    except OSError as exc:
        print(f"modelyard platform: error: {exc}", file=sys.stderr)
        return exit_status(bind_error(exc, str(exc)))
    finally:
        _stop(storage)
    return 0


def _stop_platform(args: argparse.Namespace) -> int:
    """`modelyard platform stop`: the running platform at --host/--port stops what it started, then exits."""
    import json
    import ssl
    import urllib.error
    import urllib.request

    from modelyard.platform.shutdown import STOP_PATH

    scheme = "https" if args.tls_cert else "http"
    url = f"{scheme}://{_client_host(args.host)}:{args.port}"
    context = ssl.create_default_context(cafile=args.tls_cert) if args.tls_cert else None
    headers = {"Authorization": f"Bearer {args.auth_token}"} if args.auth_token else {}
    headers["Content-Type"] = "application/json"  # the platform refuses others (a cross-site form's)
    request = urllib.request.Request(url + STOP_PATH, data=b"{}", method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120, context=context) as answer:
            stopped = json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = str(exc)
        print(f"modelyard platform stop: error: {url}: {message}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"modelyard platform stop: error: no platform answers at {url} ({getattr(exc, 'reason', exc)}); "
              "replicas and jobs a stopped one left keep running until a platform on the same store starts "
              "(it adopts them) and is stopped with `modelyard platform stop`", file=sys.stderr)
        return 1
    print(f"modelyard platform stop: {url} stopped {stopped['replicas']} replica(s) and cancelled "
          f"{stopped['jobs']} job(s); it exits now")
    return 0


async def _watch_storage(storage) -> None:
    """Start the storage process again if it dies (same port, root and flags), so the platform's
    Cloud Storage is back within seconds after a crash."""
    log = logging.getLogger("modelyard.platform.storage")
    while True:
        await asyncio.sleep(2)
        if storage.proc.poll() is None:
            continue
        log.warning("the storage process exited with %s; starting it again", storage.proc.returncode)
        try:
            await asyncio.to_thread(storage.restart)
        except OSError as exc:
            log.error("cannot start the storage process again: %s", exc)


def _stop(storage) -> None:
    if storage is not None:
        storage.stop()


STORAGE_ENV = "STORAGE_EMULATOR_HOST"


def _start_storage(config, args: argparse.Namespace, scheme: str):
    """The platform's Cloud Storage (modelyard.platform.storage) in a child process, unless
    STORAGE_EMULATOR_HOST already names one; either way that variable is set here, so every replica and
    job the platform starts (they inherit its environment) and its own gs:// reads use the same storage."""
    if config.storage_root is None:
        print(f"modelyard platform: using the Cloud Storage at {STORAGE_ENV}={os.environ[STORAGE_ENV]} "
              "(set before start), not serving its own", flush=True)
        return None
    from modelyard.platform.storage.server import StorageProcess

    port = args.storage_port if args.storage_port is not None else _default_storage_port(args.host, args.port)
    tls_args = http_limits.as_arguments(http_limits.from_args(args))
    for flag, value in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key), ("--tls-client-ca", args.tls_client_ca)):
        if value:
            tls_args += [flag, str(Path(value).resolve())]
    config.storage_root.mkdir(parents=True, exist_ok=True)
    proc = StorageProcess(config.storage_root, args.host, port, config.auth_token, tls_args,
                          config.state_dir / "storage.log")
    host = _client_host(args.host)
    config.storage_url = f"{scheme}://{host}:{port}"
    os.environ[STORAGE_ENV] = config.storage_url
    if config.auth_token:  # the platform's and its jobs' own gs:// reads (modelyard.objstore) send it
        os.environ["MODELYARD_STORAGE_TOKEN"] = config.auth_token
    print(f"modelyard platform: Cloud Storage JSON API on {config.storage_url}, objects under "
          f"{config.storage_root}; point clients at it with:\n  export {STORAGE_ENV}={config.storage_url}\n"
          f"  (or os.environ[\"{STORAGE_ENV}\"] in Python, before the first client; without it google-cloud-storage "
          "looks for Google's credentials: DefaultCredentialsError)", flush=True)
    return proc


def _client_host(host: str) -> str:
    """Where this host's clients reach a server listening on ``host``."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def _default_storage_port(host: str, port: int) -> int:
    """--port + 1 when free (8601 beside 8600), else any free port: an explicit --storage-port is never
    replaced, but the default must not stop a platform whose neighbour port happens to be in use."""
    import socket

    from modelyard.ports import free_port

    probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no conflict
    try:
        probe.bind((host, port + 1))
        return port + 1
    except OSError:
        return free_port(host)
    finally:
        probe.close()


def _tls_context(cert: str | None, key: str | None, client_ca: str | None):
    """The server's SSL context from the --tls-* flags (checked at start; the data plane makes its own)."""
    from modelyard.platform.dataplane.public_port import tls_context

    return tls_context(cert, key, client_ca)


def _api_limits(args: argparse.Namespace) -> http_limits.ConnLimits:
    """The API port's connection limits. Its front has no keep-alive limit of its own: a connection silent
    for the timeout after its last answer is closed (one being answered never is: the front reports it)."""
    limits = http_limits.from_args(args)
    return http_limits.ConnLimits(limits.client_timeout_s, limits.max_connections, limits.client_timeout_s or None)


async def _serve(platform, host: str, port: int, tls=None, storage=None, limits=None,
                 tls_files=(None, None, None)) -> None:
    """The API app on a private local port, the data-plane process (the front server, predicts) on the
    public one (dataplane/split.py), until SIGTERM/SIGINT. Stopping leaves the replicas running: the next
    start adopts them."""
    from aiohttp import web

    from modelyard.platform.dataplane import public_port
    from modelyard.platform.dataplane.split import DataPlaneProcess
    from modelyard.platform.server import build_app

    sockets = public_port.bind(host, port)  # first: a port in use stops the start before anything is done
    dataplane = DataPlaneProcess(platform, sockets, tls_files, limits or http_limits.ConnLimits())
    platform.dataplane = dataplane
    runner = web.AppRunner(build_app(platform), access_log=None)
    try:
        await dataplane.launch()  # its process loads while the platform starts
        await runner.setup()  # runs on_startup: the store is read and replicas adopted before requests are taken
    except BaseException:
        await dataplane.stop()
        raise
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        await dataplane.start(site._server.sockets[0].getsockname()[1])
    except BaseException:
        await dataplane.stop()
        await runner.cleanup()
        raise
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    platform.exit = stop.set  # `modelyard platform stop` (platform/shutdown.py), once everything is stopped
    watch = loop.create_task(_watch_storage(storage)) if storage is not None else None
    await stop.wait()
    if watch is not None:
        watch.cancel()
    from modelyard.platform import shutdown

    everything = getattr(platform, "stopped_everything", None)
    left = (everything["replicas"], everything["jobs"]) if everything else shutdown.running(platform)
    await dataplane.stop()
    await runner.cleanup()
    print(shutdown.exit_line(*left, everything=everything is not None), flush=True)
