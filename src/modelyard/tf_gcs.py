"""TensorFlow's own ``gs://`` (``tf.io.gfile``, ``model.save``, checkpoints, summary writers, ``tf.data``)
against a Cloud Storage JSON API that is not Google's: the platform's storage, or any emulator that
``STORAGE_EMULATOR_HOST`` names.

TensorFlow's built-in GCS file system (tsl's ``gcs_file_system.cc``) has no endpoint setting: its URLs
``https://www.googleapis.com/storage/v1/``, ``.../upload/storage/v1/`` and
``https://storage.googleapis.com/BUCKET/OBJECT`` are compiled in. What it does honour is libcurl's:
``HTTPS_PROXY`` (a ``CONNECT`` tunnel) and ``CURL_CA_BUNDLE`` (the CAs it trusts). So the gateway here is

- a ``CONNECT`` proxy: a tunnel to ``www.googleapis.com:443`` or ``storage.googleapis.com:443`` is
  joined to this gateway's own HTTPS port, whose certificate for those two names is signed by a CA
  made at start (never written anywhere but the bundle); a tunnel to any other host goes through
  unchanged (pip, other clients of the same process);
- an HTTPS port (``www.googleapis.com``'s JSON API paths are the storage's own; a read of
  ``storage.googleapis.com/BUCKET/OBJECT`` becomes the storage's ``alt=media`` download, ``Range``
  and all) that forwards every request to the storage, streaming both ways, TLS when the storage
  serves TLS (checked against the CAs the process trusts: ``SSL_CERT_FILE``/``REQUESTS_CA_BUNDLE``);
- a plain HTTP port with the same forwarding (``STORAGE_EMULATOR_HOST`` of a job's processes).

The ``Authorization`` header a client sends is passed on: the storage decides. A gateway given a
token adds it to requests that have none (a job's gateway, with the job's own token: what its
metadata server would give any process of the job). ``CURL_CA_BUNDLE`` holds this CA plus the CAs
the process already trusted (certifi's, the system's, ``SSL_CERT_FILE``/``REQUESTS_CA_BUNDLE``), since
``requests`` reads it too.

In a user's own process: ``modelyard.tf_gcs.enable()`` (reads ``STORAGE_EMULATOR_HOST`` and
``MODELYARD_STORAGE_TOKEN``) starts the gateway as a child process and sets the variables, before the
first ``gs://`` call. ``python -m modelyard.tf_gcs`` runs it alone and prints the variables to export.
Why a proxy rather than a file system registered for ``gs``: docs/storage.md.

May import: the standard library, aiohttp, cryptography (nothing of modelyard: jobs and users' processes
start it).
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
from pathlib import Path

from modelyard.forked import ReapedChild

GOOGLE_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
# Set beside HTTPS_PROXY by tensorflow_env: this environment's TensorFlow gs:// goes to that gateway (a
# platform job's, or a parent process's enable()), which enable() then uses rather than start another.
ROUTED_ENV = "MODELYARD_TF_GCS"
READY = "modelyard tf-gcs gateway:"  # the first line the process prints: READY + JSON of its settings
# Hop-by-hop headers (RFC 9110 7.6.1) and those the forwarding sets itself.
_DROP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
         "transfer-encoding", "upgrade", "host", "expect"}
_CA_PATHS = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


# ---- the CA and the certificate for Google's storage hosts ----------------------------------------
def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A fresh CA and a certificate for ``GOOGLE_HOSTS`` signed by it, under ``directory``:
    (leaf certificate, its key, the CA bundle to trust: this CA plus the CAs already trusted)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "modelyard tf-gcs gateway CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, GOOGLE_HOSTS[0])]))
            .issuer_name(ca_name).public_key(leaf_key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in GOOGLE_HOSTS]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    cert, key, bundle = directory / "gateway.pem", directory / "gateway.key", directory / "ca-bundle.pem"
    cert.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key.touch(mode=0o600)
    key.write_bytes(leaf_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    bundle.write_bytes(ca.public_bytes(serialization.Encoding.PEM) + b"".join(_trusted_pems()))
    return cert, key, bundle


def _trusted_pems() -> list[bytes]:
    """The CAs this process trusts already: ``CURL_CA_BUNDLE`` (requests and libcurl read it), then
    ``REQUESTS_CA_BUNDLE`` / ``SSL_CERT_FILE`` (a platform's own TLS CA), certifi's and the system's."""
    paths = [os.environ.get(v) for v in ("CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")]
    try:
        import certifi

        paths.append(certifi.where())
    except ImportError:
        pass
    out, seen = [], set()
    for p in [*paths, *_CA_PATHS]:
        if p and p not in seen and os.path.isfile(p):
            seen.add(p)
            out.append(Path(p).read_bytes().rstrip(b"\n") + b"\n")
    return out


def client_tls() -> ssl.SSLContext:
    """How the gateway checks a TLS storage: the CAs of ``SSL_CERT_FILE``/``REQUESTS_CA_BUNDLE`` when set
    (as the Python clients of the storage do), else the system's."""
    ctx = ssl.create_default_context()
    for var in ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        if os.environ.get(var) and os.path.isfile(os.environ[var]):
            ctx.load_verify_locations(os.environ[var])
    return ctx


# ---- request mapping (pure) -----------------------------------------------------------------------
def upstream_target(host: str, raw_path: str) -> str | None:
    """The storage's path and query for a request to ``host`` (Google's host, or the gateway itself);
    None when it names nothing the storage serves. ``storage.googleapis.com/BUCKET/OBJECT`` (TensorFlow's
    reads) is the JSON API's ``alt=media`` download of that object; everything else is the same path."""
    if host.split(":")[0].lower() != "storage.googleapis.com":
        return raw_path
    path, _, query = raw_path.partition("?")
    bucket, _, name = path.lstrip("/").partition("/")
    if not bucket or not name:
        return None
    return f"/download/storage/v1/b/{bucket}/o/{name}?alt=media" + (f"&{query}" if query else "")


def forward_headers(headers, token: str | None) -> dict[str, str]:
    """The request's headers for the storage: hop-by-hop ones dropped, the gateway's token added when
    the client sent no ``Authorization``."""
    out = {k: v for k, v in headers.items() if k.lower() not in _DROP}
    if token and not any(k.lower() == "authorization" for k in out):
        out["Authorization"] = f"Bearer {token}"
    return out


def rewrite_location(value: str, storage_url: str, own_base: str) -> str:
    """A ``Location`` (a resumable upload's session URI) of the storage, as the client must call it again:
    through this gateway."""
    return own_base + value[len(storage_url):] if value.startswith(storage_url) else value


# ---- the gateway ----------------------------------------------------------------------------------
class Gateway:
    """The proxy, the HTTPS port for Google's hosts and the plain port, forwarding to ``storage_url``."""

    def __init__(self, storage_url: str, token: str | None, cert_dir: Path, host: str = "127.0.0.1",
                 sockets: tuple[socket.socket, socket.socket] | None = None) -> None:
        self.storage_url = storage_url.rstrip("/")
        self.token = token
        self.host = host
        made = (cert_dir / "gateway.pem", cert_dir / "gateway.key", cert_dir / "ca-bundle.pem")
        self.cert, self.key, self.bundle = made if all(f.exists() for f in made) else make_certificates(cert_dir)
        self._sockets = sockets  # (plain, proxy), listening already: bound by whoever started this process
        self.proxy_port = self.plain_port = 0
        self._tls: ssl.SSLContext | None = None
        self._session = None
        self._runners: list = []
        self._proxy = None

    async def start(self) -> None:
        import aiohttp
        from aiohttp import web

        self._session = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
            connector=aiohttp.TCPConnector(ssl=client_tls() if self.storage_url.startswith("https") else False))
        self._tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._tls.load_cert_chain(self.cert, self.key)
        app = web.Application(client_max_size=1 << 40)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        if self._sockets is None:
            site = web.TCPSite(runner, self.host, 0)
            await site.start()
            self._proxy = await asyncio.start_server(self._tunnel, self.host, 0, limit=1 << 20)
        else:
            site = web.SockSite(runner, self._sockets[0])
            await site.start()
            self._proxy = await asyncio.start_server(self._tunnel, sock=self._sockets[1], limit=1 << 20)
        self._runners.append(runner)
        self.plain_port = site._server.sockets[0].getsockname()[1]
        self.proxy_port = self._proxy.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._proxy is not None:
            self._proxy.close()
        for runner in self._runners:
            await runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def settings(self) -> dict:
        return {"proxy": f"http://{self.host}:{self.proxy_port}", "storage": f"http://{self.host}:{self.plain_port}",
                "ca_bundle": str(self.bundle)}

    async def handle(self, request):
        """Forward one request to the storage, streaming its body and the answer."""
        from aiohttp import web

        target = upstream_target(request.host, request.raw_path)
        if target is None:
            body = {"error": {"code": 404, "message": f"Not Found: {request.raw_path}",
                              "errors": [{"reason": "notFound", "domain": "global"}]}}
            return web.json_response(body, status=404)
        has_body = request.method in ("POST", "PUT", "PATCH") and (request.can_read_body or request.content_length)
        async with self._session.request(request.method, self.storage_url + target,
                                         headers=forward_headers(request.headers, self.token),
                                         data=request.content if has_body else None,
                                         allow_redirects=False, skip_auto_headers=("Accept-Encoding",)) as up:
            headers = {k: v for k, v in up.headers.items() if k.lower() not in _DROP}
            if "Location" in headers:
                # Through a tunnel the client spoke HTTPS to Google's host: its next call must too.
                scheme = "https" if request.host.split(":")[0].lower() in GOOGLE_HOSTS else request.scheme
                headers["Location"] = rewrite_location(headers["Location"], self.storage_url,
                                                       f"{scheme}://{request.host}")
            resp = web.StreamResponse(status=up.status, reason=up.reason, headers=headers)
            await resp.prepare(request)
            if request.method != "HEAD":
                async for chunk in up.content.iter_chunked(1 << 20):
                    await resp.write(chunk)
            await resp.write_eof()
            return resp

    async def _tunnel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One ``CONNECT``: Google's storage hosts answered here over TLS, other hosts joined as they are."""
        upstream = None
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            if method.upper() != "CONNECT":
                writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            host, _, port = target.rpartition(":")
            host = host.strip("[]")
            google = host.lower() in GOOGLE_HOSTS and port == "443"
            try:
                upstream = await asyncio.open_connection(*((self.host, self.plain_port) if google else (host, int(port))))
            except (OSError, ValueError) as exc:
                writer.write(f"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nX-Reason: {exc}\r\n\r\n".encode())
                return
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            if google:
                await writer.start_tls(self._tls)
                await asyncio.gather(_requests(reader, upstream[1]), _pipe(upstream[0], writer))
            else:
                await asyncio.gather(_pipe(reader, upstream[1]), _pipe(upstream[0], writer))
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ssl.SSLError, ValueError):
            pass
        finally:
            for w in ([writer] + ([upstream[1]] if upstream else [])):
                w.close()


def clean_head(head: bytes) -> tuple[bytes, int | None]:
    """A request head as HTTP/1.1 parsers take it, and its body's length (None: chunked). libcurl, as
    TensorFlow drives it, sends ``Transfer-Encoding: identity`` or ``chunked`` beside ``Content-Length``,
    which Google accepts and aiohttp refuses: the ``identity`` line is dropped, and a chunked body's
    ``Content-Length`` (RFC 9112 6.3: the chunking wins)."""
    lines = head.rstrip(b"\r\n").split(b"\r\n")
    kept, length, chunked = [lines[0]], 0, False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"transfer-encoding":
            if value == b"identity":
                continue
            chunked = True
        elif name == b"content-length":
            length = int(value)
        kept.append(line)
    if chunked:
        kept = [line for line in kept if line.partition(b":")[0].strip().lower() != b"content-length"]
    return b"\r\n".join(kept) + b"\r\n\r\n", None if chunked else length


async def _requests(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    """Copy requests from a tunnel's client to the forwarding server, each head cleaned (``clean_head``)."""
    try:
        while True:
            try:
                head = await src.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            head, length = clean_head(head)
            dst.write(head)
            if length is None:
                await _copy_chunked(src, dst)
            else:
                await _copy(src, dst, length)
            await dst.drain()
    except ConnectionError:
        pass
    finally:
        _end_write(dst)


def _end_write(dst: asyncio.StreamWriter) -> None:
    """Half-close ``dst`` (the peer reads its end) unless it is gone already."""
    try:
        dst.write_eof()
    except (OSError, RuntimeError):
        pass


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter, length: int) -> None:
    while length > 0:
        data = await src.read(min(length, 1 << 20))
        if not data:
            raise ConnectionError("the client closed the tunnel in a request body")
        length -= len(data)
        dst.write(data)
        await dst.drain()


async def _copy_chunked(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    """One chunked body (RFC 9112 7.1), copied as it is, up to its last chunk and trailers."""
    while True:
        size_line = await src.readuntil(b"\r\n")
        dst.write(size_line)
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (trailer := await src.readuntil(b"\r\n")) != b"\r\n":
                dst.write(trailer)
            dst.write(b"\r\n")
            return
        await _copy(src, dst, size + 2)  # the data and its CRLF


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(1 << 18):
            dst.write(data)
            await dst.drain()
    except ConnectionError:
        pass
    finally:
        _end_write(dst)


# ---- what a TensorFlow process needs --------------------------------------------------------------
def tensorflow_env(settings: dict, token: str | None = None, environ: dict | None = None) -> dict[str, str]:
    """The variables that send a process's TensorFlow ``gs://`` through the gateway (``settings``: its
    ``settings()``). ``token``: the one TensorFlow sends (``GOOGLE_AUTH_TOKEN_FOR_TESTING``, TensorFlow's
    own fixed-token setting); without one TensorFlow looks for none (``NO_GCE_CHECK``), unless a
    metadata server is named (``GCE_METADATA_HOST``: a platform job's), which it then asks."""
    environ = os.environ if environ is None else environ
    local = "127.0.0.1,localhost,::1"
    no_proxy = ",".join(p for p in (environ.get("NO_PROXY") or environ.get("no_proxy"), local) if p)
    out = {"HTTPS_PROXY": settings["proxy"], "https_proxy": settings["proxy"], "NO_PROXY": no_proxy,
           "no_proxy": no_proxy, "CURL_CA_BUNDLE": settings["ca_bundle"], ROUTED_ENV: settings["proxy"]}
    if token:
        out["GOOGLE_AUTH_TOKEN_FOR_TESTING"] = token
    elif not environ.get("GCE_METADATA_HOST"):
        out["NO_GCE_CHECK"] = "true"
    return out


def _die_with_parent() -> None:
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _forked(module: str, args: list[str], env: dict, keep: list[int]):
    """``python -m module args`` as ``start_process`` starts it (stdin and stdout /dev/null, only ``keep`` of
    the caller's descriptors beyond stderr, ``env``, the caller's death its end), forked from this process;
    a ``subprocess.Popen``-like handle (``modelyard.forked``: pid, poll, wait, kill)."""
    import importlib

    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _die_with_parent()
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)
            low = 3
            for fd in sorted(keep) + [65536]:  # every other descriptor closed, as Popen's close_fds does
                os.closerange(low, fd)
                low = fd + 1
            os.environ.clear()
            os.environ.update(env)
            code = importlib.import_module(module).main(args) or 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001  (never return into the caller's code)
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    return ReapedChild(pid)


def start_process(storage_url: str, token: str | None, cert_dir: Path, extra: list[str] = (),
                  module: str = "modelyard.tf_gcs", env: dict | None = None,
                  fork: bool = False) -> tuple[subprocess.Popen, dict]:
    """Start a gateway process (``module``'s ``main``) that dies with the caller; (process, settings).

    The caller makes the certificates and binds the listening sockets, then hands them to the process:
    the settings are known at once, and a client that connects before the process serves waits in the
    socket's backlog (a job's replicas start without waiting for the gateway's imports). ``fork``: the
    process is forked from the caller (which must run no other thread) rather than a fresh Python, when
    the caller has imported what it needs already (a platform job's warm process: no Python start-up)."""
    _, _, bundle = make_certificates(cert_dir)
    child_env = dict(os.environ if env is None else env)
    child_env["MODELYARD_GATEWAY_TOKEN"] = token or ""  # not on the command line: ps shows that
    src = str(Path(__file__).resolve().parents[1])
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (src, child_env.get("PYTHONPATH", "")) if p)
    socks = []
    try:
        for _ in range(2):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sock.listen(512)
            socks.append(sock)
        fds = ",".join(str(s.fileno()) for s in socks)
        args = ["--storage", storage_url, "--cert-dir", str(cert_dir), "--listen-fds", fds, *extra]
        if fork:
            proc = _forked(module, args, child_env, [s.fileno() for s in socks])
        else:
            proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.DEVNULL,
                                    stdin=subprocess.DEVNULL, env=child_env, pass_fds=[s.fileno() for s in socks],
                                    preexec_fn=_die_with_parent)
        plain, proxy = (s.getsockname()[1] for s in socks)
    finally:
        for sock in socks:
            sock.close()
    return proc, {"proxy": f"http://127.0.0.1:{proxy}", "storage": f"http://127.0.0.1:{plain}",
                  "ca_bundle": str(bundle)}


def add_arguments(parser) -> None:
    """The gateway process's flags (``python -m modelyard.tf_gcs``, a job's metadata server)."""
    parser.add_argument("--storage", default=os.environ.get("STORAGE_EMULATOR_HOST"),
                        help="the storage's URL (default: $STORAGE_EMULATOR_HOST)")
    parser.add_argument("--cert-dir", default=None, help="where the CA bundle is written (default: a new temp dir)")
    parser.add_argument("--host", default="127.0.0.1", type=_loopback_host,
                        help="a loopback address to listen on (default 127.0.0.1): the gateway adds a "
                        "job's token to what it forwards, so it never listens beyond this host")
    parser.add_argument("--listen-fds", default=None, help="PLAIN,PROXY: descriptors of sockets listening "
                        "already (start_process)")


def _loopback_host(host: str) -> str:
    """``host`` when it is a loopback address; otherwise argparse's error, saying why."""
    import argparse
    import ipaddress

    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise argparse.ArgumentTypeError(f"{host!r} is not a loopback address: the gateway forwards with a "
                                         "job's credentials and listens on this host only (127.0.0.1, ::1)")
    return host


def gateway_args(args) -> dict:
    """Gateway(...) keyword arguments from the flags of ``add_arguments``."""
    storage = args.storage if "://" in args.storage else "http://" + args.storage
    sockets = None
    if args.listen_fds:
        sockets = tuple(socket.socket(fileno=int(fd)) for fd in args.listen_fds.split(","))
    return {"storage_url": storage, "token": os.environ.pop("MODELYARD_GATEWAY_TOKEN", "") or None,
            "cert_dir": Path(args.cert_dir or tempfile.mkdtemp(prefix="modelyard-tf-gcs-")), "host": args.host,
            "sockets": sockets}


def routed(environ: dict | None = None) -> bool:
    """Whether ``environ``'s (default: this process's) TensorFlow ``gs://`` goes to a gateway that answers."""
    environ = os.environ if environ is None else environ
    proxy = environ.get(ROUTED_ENV)
    if not proxy or environ.get("HTTPS_PROXY") != proxy or not environ.get("CURL_CA_BUNDLE"):
        return False
    host, _, port = proxy.split("://", 1)[-1].rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except (OSError, ValueError):
        return False


_ENABLED: tuple[subprocess.Popen, dict] | None = None
_SAVED: dict[str, str | None] = {}  # what enable() replaced, for disable()


def enable(storage_url: str | None = None, token: str | None = None) -> dict[str, str]:
    """Send this process's TensorFlow ``gs://`` to the storage at ``storage_url`` (default:
    ``STORAGE_EMULATOR_HOST``) with ``token`` (default: ``MODELYARD_STORAGE_TOKEN``, the platform's
    ``--auth-token``). Call it before the first ``gs://`` call; calling it again is a no-op. Returns
    the variables it set: none when this process's TensorFlow goes to a gateway already (``routed``: in a
    platform job, whose gateway adds the job's own token), unless ``storage_url`` is given."""
    global _ENABLED
    if _ENABLED is None and storage_url is None and routed():
        return {}
    storage_url = storage_url or os.environ.get("STORAGE_EMULATOR_HOST")
    if not storage_url:
        raise RuntimeError("modelyard.tf_gcs.enable: no storage to send gs:// to: set STORAGE_EMULATOR_HOST "
                           "(modelyard platform prints it) or pass storage_url")
    if "://" not in storage_url:
        storage_url = "http://" + storage_url
    token = token or os.environ.get("MODELYARD_STORAGE_TOKEN")
    if _ENABLED is None or _ENABLED[0].poll() is not None:
        _ENABLED = start_process(storage_url, None, Path(tempfile.mkdtemp(prefix="modelyard-tf-gcs-")))
        import atexit

        atexit.register(disable)  # the gateway's key and bundle do not outlive the process
    env = tensorflow_env(_ENABLED[1], token)
    for name in env:
        _SAVED.setdefault(name, os.environ.get(name))
    os.environ.update(env)
    return env


def disable() -> None:
    """Undo ``enable()``: the variables it set are as they were, its gateway is stopped."""
    global _ENABLED
    for name, value in _SAVED.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _SAVED.clear()
    if _ENABLED is not None:
        import shutil

        _ENABLED[0].terminate()
        _ENABLED[0].wait(10)
        shutil.rmtree(Path(_ENABLED[1]["ca_bundle"]).parent, ignore_errors=True)
        _ENABLED = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modelyard.tf_gcs",
                                     description="Send TensorFlow's gs:// to a Cloud Storage JSON API (the platform's).")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if not args.storage:
        parser.error("--storage (or STORAGE_EMULATOR_HOST) is required")
    asyncio.run(_serve(Gateway(**gateway_args(args))))
    return 0


async def _serve(gateway: Gateway) -> None:
    import logging
    import signal

    # Tunnels still open when the process is stopped are dropped with it: nothing to report.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)

    await gateway.start()
    print(READY + json.dumps(gateway.settings()), flush=True)
    if sys.stdout.isatty():
        for k, v in tensorflow_env(gateway.settings(), os.environ.get("MODELYARD_STORAGE_TOKEN")).items():
            print(f"export {k}={v}")
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await gateway.close()


if __name__ == "__main__":
    sys.exit(main())
