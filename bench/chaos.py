"""A fault schedule for the platform, its Cloud Storage and its replicas, in the spirit of Jepsen (issue 43).

    python3 bench/chaos.py                 # 60 s
    python3 bench/chaos.py --minutes 30    # the issue's run
    python3 bench/chaos.py --seconds 20 --out /tmp/chaos.md
    python3 bench/chaos.py --storage-only  # the storage's clients and faults alone

One storage process (``python -m modelyard.platform.storage``) on a temporary root, and one
``modelyard platform`` using it as its Cloud Storage (``bench/chaos_platform.py``: its clients, faults
and checks). Storage client threads work on shared names at once: writers (media and multipart
uploads, half of them compare-and-set with ``ifGenerationMatch``), readers, copiers
(``rewriteTo``/``copyTo`` with ``ifSourceGenerationMatch``), resumable uploaders (chunks of 256 KiB
multiples; now and then a chunk sent twice at once, or an earlier one again; after an error they ask
the session what it kept and go on from there), and bucket deleters racing uploaders into their
buckets. Platform clients create endpoints and upload models, submit and cancel CustomJobs, and
predict on a deployed endpoint. A nemesis, at random times (mean ``--every`` seconds), takes these
faults in turn: kill -9 of the platform (started again on its store and state directory), kill -9 of
the storage (started again on the same port), kill -9 of the endpoint's replica (the platform must
start another), and a disk that fills for 0.5-3 s and is freed. A short run goes on until each kind
struck once.

The full disk is the kernel's own refusal, not a simulation in the server: ``RLIMIT_FSIZE`` set on
the running storage process (``prlimit``) to 256 KiB, so a write past that size is cut short and the
next one fails with EFBIG, as a full disk cuts a write short and then fails with ENOSPC. It needs no
root. It limits each file rather than the disk's total: small objects can still be written while
large ones fail, and it is harsher than a full disk on the metadata database (no write lands past
256 KiB of any file, even inside it), so metadata reads fail too for a while (503, retryable).

The checker (every answer is checked; a 5xx or no answer is "indeterminate": it may or may not
have happened; a client backs off 50 ms after a refused connection, as a retrying client would):

- lost / corrupted: every acknowledged object (200) reads back at the end, with the CRC32C it was
  acknowledged with (objects under unique names: uploads, resumable uploads, copies); a shared
  name's final generation is not older than its last acknowledged one, and holds its bytes if equal;
- mixed reads: a download's body has the length and CRC32C its headers give, and a generation's
  bytes are the ones its write was acknowledged with (and the same in every read);
- compare-and-set: two writes conditional on the same generation of a name never both succeed, and
  a copy made under ``ifSourceGenerationMatch=G`` holds generation G's bytes;
- buckets: an acknowledged upload into a bucket is there until its writer deletes it (so a bucket
  delete racing it answers 409), and a bucket deleted with 204 can be created again (no upload left
  its folder behind without its record);
- stuck: a request with no answer within 30 s; resumable sessions lost (404) while not finished;
- registry and jobs: see ``chaos_platform`` (nothing acknowledged lost after the platform's kills,
  no job or operation stuck, predicts answered again after each kill, one replica per deployment);
- orphans: processes left running under the run's directory (the storage root, the platform's state
  directory and its jobs' working directories) after the run and ``modelyard platform stop``.

Reported: operations per kind (ok / refused / indeterminate), faults injected, violations, and
throughput (acknowledged MB written and MB read per second under the faults). The table goes to
``bench/results/chaos.md`` (or ``--out``); exit status 1 when there is any violation.
"""
from __future__ import annotations

import argparse
import base64
import collections
import json
import os
import random
import resource
import signal
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import google_crc32c
import requests

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from harness import (Service, command_line, free_port, http_ok, log, machine, markdown_table,  # noqa: E402
                     write_results)
from chaos_platform import FAILED, NO_ANSWER, Indeterminate, Platform, PlatformChaos  # noqa: E402

BUCKET = "chaos"
DELETE_BUCKETS = ("chaos-del-0", "chaos-del-1")
SHARED = [f"shared/{i}" for i in range(6)]
REQUEST_TIMEOUT_S = 30.0
DISK_FULL_BYTES = 256 << 10


def crc_of(data: bytes) -> str:
    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()


class Storage:
    """The storage process, killed and started again on the same port and root."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.root = work / "root"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.starts = 0
        self.service: Service | None = None
        self.lock = threading.Lock()
        self.unexpected_exits = 0

    def start(self) -> None:
        self.starts += 1
        cmd = [sys.executable, "-m", "modelyard.platform.storage", "--root", str(self.root), "--port", str(self.port)]
        self.service = Service(f"storage #{self.starts}", cmd, self.work / f"storage-{self.starts}.log",
                               ready=http_ok(self.url + "/healthz"), timeout=60)
        self.service.start()

    def kill9(self) -> None:
        os.kill(self.service.pid, signal.SIGKILL)
        self.service.proc.wait()
        self.service.stop()

    def disk_full(self, full: bool) -> None:
        limit = DISK_FULL_BYTES if full else resource.RLIM_INFINITY
        try:
            resource.prlimit(self.service.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()


class Chaos:
    def __init__(self, storage: Storage, seconds: float, every: float, seed: int) -> None:
        self.s = storage
        self.plat: PlatformChaos | None = None  # the platform's clients and faults (None: the storage alone)
        self.seconds = seconds
        self.every = every
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ops: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.violations: list[str] = []
        self.faults: collections.Counter = collections.Counter()
        self.unique_acked: dict[str, str] = {}  # bucket/name -> crc32c acknowledged
        self.gen_crc: dict[tuple[str, int], str] = {}  # (shared name, generation) -> crc32c (acked or read)
        self.last_acked: dict[str, tuple[int, str]] = {}  # shared name -> (generation, crc) of the newest ack
        self.cas: dict[tuple[str, int], int] = collections.Counter()  # (name, condition generation) -> successes
        self.bytes_written = 0
        self.bytes_read = 0
        self.stuck = 0
        self.sessions_lost = 0

    # ---- plumbing -------------------------------------------------------------------------------
    def violation(self, what: str) -> None:
        with self.lock:
            self.violations.append(what)
        log(f"VIOLATION: {what}")

    def count(self, kind: str, outcome: str) -> None:
        with self.lock:
            self.ops[kind][outcome] += 1

    def call(self, method: str, url: str, **kw) -> requests.Response:
        """One request; a 5xx or no answer raises Indeterminate."""
        try:
            r = requests.request(method, url, timeout=REQUEST_TIMEOUT_S, **kw)
        except requests.Timeout:
            with self.lock:
                self.stuck += 1
            raise Indeterminate(NO_ANSWER, "no answer in time") from None
        except requests.RequestException as exc:
            time.sleep(0.05)  # the storage is down: back off a little, as a client's retry would
            raise Indeterminate(NO_ANSWER, type(exc).__name__) from None
        if r.status_code >= 500:
            raise Indeterminate(FAILED, f"{r.status_code}")
        return r

    def answered(self, method: str, url: str, **kw) -> requests.Response:
        """The same request until it is answered (for the checker's own reads and clean-ups)."""
        deadline = time.monotonic() + 120
        while True:
            try:
                return self.call(method, url, **kw)
            except Indeterminate:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def obj_url(self, bucket: str, name: str) -> str:
        return f"{self.s.url}/storage/v1/b/{bucket}/o/{quote(name, safe='')}"

    def acked_shared(self, name: str, gen: int, crc: str) -> None:
        with self.lock:
            self.remember(name, gen, crc, "acknowledged write")
            if name not in self.last_acked or self.last_acked[name][0] < gen:
                self.last_acked[name] = (gen, crc)

    def remember(self, name: str, gen: int, crc: str, how: str) -> None:
        known = self.gen_crc.setdefault((name, gen), crc)
        if known != crc:
            self.violations.append(f"{name}#{gen}: {how} has CRC32C {crc}, another answer said {known}")

    def upload(self, bucket: str, name: str, data: bytes, cond: dict | None = None) -> requests.Response:
        params = {"name": name, **(cond or {})}
        if self.rng.random() < 0.5:
            return self.call("POST", f"{self.s.url}/upload/storage/v1/b/{bucket}/o",
                             params={"uploadType": "media", **params}, data=data)
        body = (b"--xx\r\nContent-Type: application/json\r\n\r\n{}\r\n--xx\r\n"
                b"Content-Type: application/octet-stream\r\n\r\n" + data + b"\r\n--xx--\r\n")
        return self.call("POST", f"{self.s.url}/upload/storage/v1/b/{bucket}/o",
                         params={"uploadType": "multipart", **params}, data=body,
                         headers={"Content-Type": "multipart/related; boundary=xx"})

    def body(self) -> bytes:
        size = self.rng.choice([0, 1, 100, 4096]) if self.rng.random() < 0.1 else self.rng.randint(1, 512 << 10)
        return os.urandom(size)

    # ---- clients --------------------------------------------------------------------------------
    def writer(self) -> None:
        while not self.stop.is_set():
            name = self.rng.choice(SHARED)
            data = self.body()
            cond = None
            if self.rng.random() < 0.5:  # compare-and-set on the generation last seen
                try:
                    r = self.call("GET", self.obj_url(BUCKET, name))
                    cond = {"ifGenerationMatch": r.json()["generation"] if r.status_code == 200 else "0"}
                except Indeterminate:
                    continue
            try:
                r = self.upload(BUCKET, name, data, cond)
            except Indeterminate as exc:
                self.count("write", exc.outcome)
                continue
            if r.status_code == 412:
                self.count("write", "refused")
                continue
            if r.status_code != 200:
                self.violation(f"write {name}: {r.status_code} {r.text[:200]}")
                continue
            self.count("write", "ok")
            doc = r.json()
            gen = int(doc["generation"])
            if doc["crc32c"] != crc_of(data) or int(doc["size"]) != len(data):
                self.violation(f"write {name}#{gen}: acknowledged with {doc['crc32c']}/{doc['size']}, "
                               f"sent {crc_of(data)}/{len(data)}")
            with self.lock:
                self.bytes_written += len(data)
                if cond is not None:
                    key = (name, int(cond["ifGenerationMatch"]))
                    self.cas[key] += 1
                    if self.cas[key] > 1:
                        self.violations.append(f"two writes to {name} conditional on generation {key[1]} succeeded")
                    if gen <= key[1]:
                        self.violations.append(f"{name}: CAS on {key[1]} made an older generation {gen}")
            self.acked_shared(name, gen, crc_of(data))

    def reader(self) -> None:
        while not self.stop.is_set():
            name = self.rng.choice(SHARED)
            try:
                r = self.call("GET", f"{self.s.url}/download/storage/v1/b/{BUCKET}/o/{quote(name, safe='')}",
                              params={"alt": "media"})
            except Indeterminate as exc:
                self.count("read", exc.outcome)
                continue
            if r.status_code == 404:
                self.count("read", "refused")
                continue
            if r.status_code != 200:
                self.violation(f"read {name}: {r.status_code} {r.text[:200]}")
                continue
            self.count("read", "ok")
            header_crc = r.headers["x-goog-hash"].split("crc32c=")[1].split(",")[0]
            gen = int(r.headers["x-goog-generation"])
            with self.lock:
                self.bytes_read += len(r.content)
            if len(r.content) != int(r.headers["x-goog-stored-content-length"]) or crc_of(r.content) != header_crc:
                self.violation(f"read {name}#{gen}: a body of {len(r.content)} bytes with CRC32C "
                               f"{crc_of(r.content)}, headers said {r.headers['x-goog-stored-content-length']}"
                               f"/{header_crc} (mixed generations)")
                continue
            with self.lock:
                self.remember(name, gen, header_crc, "a read")

    def copier(self) -> None:
        while not self.stop.is_set():
            src = self.rng.choice(SHARED)
            try:
                r = self.call("GET", self.obj_url(BUCKET, src))
                if r.status_code != 200:
                    continue
                gen = int(r.json()["generation"])
                dest = f"copies/{uuid.uuid4().hex}"
                verb = self.rng.choice(["rewriteTo", "copyTo"])
                r = self.call("POST", f"{self.obj_url(BUCKET, src)}/{verb}/b/{BUCKET}/o/{quote(dest, safe='')}",
                              params={"ifSourceGenerationMatch": gen})
            except Indeterminate as exc:
                self.count("copy", exc.outcome)
                continue
            if r.status_code in (412, 404):
                self.count("copy", "refused")
                continue
            if r.status_code != 200:
                self.violation(f"copy {src}: {r.status_code} {r.text[:200]}")
                continue
            self.count("copy", "ok")
            doc = r.json().get("resource", r.json())
            with self.lock:
                known = self.gen_crc.get((src, gen))
                self.unique_acked[f"{BUCKET}/{dest}"] = doc["crc32c"]
            if known is not None and known != doc["crc32c"]:
                self.violation(f"copy of {src} under ifSourceGenerationMatch={gen}: CRC32C {doc['crc32c']}, "
                               f"generation {gen} has {known}")

    def unique_writer(self) -> None:
        while not self.stop.is_set():
            name = f"unique/{uuid.uuid4().hex}"
            data = self.body()
            try:
                r = self.upload(BUCKET, name, data)
            except Indeterminate as exc:
                self.count("unique write", exc.outcome)
                continue
            if r.status_code != 200 or r.json()["crc32c"] != crc_of(data):
                self.violation(f"unique write {name}: {r.status_code} {r.text[:200]}")
                continue
            self.count("unique write", "ok")
            with self.lock:
                self.unique_acked[f"{BUCKET}/{name}"] = crc_of(data)
                self.bytes_written += len(data)

    def resumable(self) -> None:
        chunk_unit = 256 << 10
        while not self.stop.is_set():
            name = f"resumable/{uuid.uuid4().hex}"
            data = os.urandom(self.rng.randint(1, 12) * chunk_unit - self.rng.randint(0, chunk_unit - 1))
            total = len(data)
            try:
                r = self.call("POST", f"{self.s.url}/upload/storage/v1/b/{BUCKET}/o",
                              params={"uploadType": "resumable", "name": name}, json={})
                url = r.headers["Location"]
            except (Indeterminate, KeyError):
                continue
            outcome = self._send_session(url, data, total, chunk_unit)
            self.count("resumable", outcome)
            if outcome == "ok":
                with self.lock:
                    self.unique_acked[f"{BUCKET}/{name}"] = crc_of(data)
                    self.bytes_written += total

    def _send_session(self, url: str, data: bytes, total: int, unit: int) -> str:
        offset = 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not self.stop.is_set():
            start = offset
            if offset and self.rng.random() < 0.15:  # an earlier chunk again: must be taken once
                start = max(0, offset - unit)
            end = min(total, start + self.rng.randint(1, 4) * unit)
            headers = {"Content-Range": f"bytes {start}-{end - 1}/{total}"}
            try:
                if self.rng.random() < 0.15:  # the same chunk twice at once (a client retry racing the first)
                    results: list = []
                    twin = threading.Thread(target=lambda: results.append(self._put(url, data[start:end], headers)))
                    twin.start()
                    r = self._put(url, data[start:end], headers)
                    twin.join()
                    for other in results:
                        if isinstance(other, requests.Response) and other.status_code == 400:
                            self.violation(f"resumable twin chunk refused: {other.text[:200]}")
                    if isinstance(r, Exception):
                        raise r
                else:
                    r = self.call("PUT", url, data=data[start:end], headers=headers)
                if r.status_code == 200:
                    return self._check_final(r, data)
                if r.status_code == 404:
                    with self.lock:
                        self.sessions_lost += 1
                    self.violation(f"resumable session lost: {r.text[:200]}")
                    return "refused"
                if r.status_code != 308:
                    self.violation(f"resumable chunk {start}-{end - 1}: {r.status_code} {r.text[:200]}")
                    return "refused"
            except Indeterminate:
                pass  # ask the session what it kept
            try:
                r = self.call("PUT", url, headers={"Content-Range": f"bytes */{total}"})
            except Indeterminate:
                time.sleep(0.1)
                continue
            if r.status_code == 200:
                return self._check_final(r, data)
            if r.status_code != 308:
                self.violation(f"resumable status: {r.status_code} {r.text[:200]}")
                return "refused"
            kept = int(r.headers["Range"].split("-")[1]) + 1 if "Range" in r.headers else 0
            if kept > total:
                self.violation(f"resumable session kept {kept} of {total} bytes")
                return "refused"
            offset = kept
        return NO_ANSWER  # not finished in time

    def _put(self, url, body, headers):
        try:
            return self.call("PUT", url, data=body, headers=headers)
        except Indeterminate as exc:
            return exc

    def _check_final(self, r: requests.Response, data: bytes) -> str:
        doc = r.json()
        if doc["crc32c"] != crc_of(data) or int(doc["size"]) != len(data):
            self.violation(f"resumable {doc['name']}: acknowledged {doc['size']} bytes / {doc['crc32c']}, "
                           f"sent {len(data)} / {crc_of(data)}")
        return "ok"

    def bucket_uploader(self, bucket: str) -> None:
        while not self.stop.is_set():
            name = f"o-{uuid.uuid4().hex[:12]}"
            data = os.urandom(self.rng.randint(1, 32 << 10))
            try:
                r = self.upload(bucket, name, data)
            except Indeterminate as exc:
                self.count("upload into deleted bucket", exc.outcome)
                # it may have landed: remove it (if there) so the bucket can be deleted again
                try:
                    self.answered("DELETE", self.obj_url(bucket, name))
                except Indeterminate:
                    pass
                continue
            if r.status_code == 404:
                self.count("upload into deleted bucket", "refused")
                continue
            if r.status_code != 200:
                self.violation(f"upload into {bucket}: {r.status_code} {r.text[:200]}")
                continue
            self.count("upload into deleted bucket", "ok")
            try:
                got = self.answered("GET", self.obj_url(bucket, name))
                if got.status_code != 200:
                    self.violation(f"acknowledged {bucket}/{name} vanished ({got.status_code}): its bucket was "
                                   "deleted under it")
                    continue
                r = self.answered("DELETE", self.obj_url(bucket, name))
                if r.status_code not in (204, 404):
                    self.violation(f"delete {bucket}/{name}: {r.status_code}")
            except Indeterminate:
                pass

    def bucket_deleter(self, bucket: str) -> None:
        while not self.stop.is_set():
            try:
                r = self.call("DELETE", f"{self.s.url}/storage/v1/b/{bucket}")
            except Indeterminate as exc:
                self.count("bucket delete", exc.outcome)
                r = None
            if r is not None and r.status_code == 409:
                self.count("bucket delete", "refused")
                time.sleep(0.005)
                continue
            if r is not None and r.status_code not in (204, 404):
                self.violation(f"delete bucket {bucket}: {r.status_code} {r.text[:200]}")
                continue
            if r is not None:
                self.count("bucket delete", "ok")
            first = True  # create it again; a 409 after an unanswered try may be that try's own success
            while not self.stop.is_set():
                try:
                    c = self.call("POST", f"{self.s.url}/storage/v1/b", json={"name": bucket})
                except Indeterminate:
                    first = False
                    time.sleep(0.05)
                    continue
                if c.status_code == 409 and first and r is not None and r.status_code == 204:
                    self.violation(f"bucket {bucket} deleted (204) was still there: an upload re-created its "
                                   "folder without its record")
                break

    # ---- the nemesis ----------------------------------------------------------------------------
    def nemesis(self) -> None:
        """Faults at random times (exponential gaps, mean ``every``); the kinds take turns (the platform's
        first), so even a short run has each."""
        rng = random.Random(self.rng.random())  # its own: the clients' threads do not shift its schedule
        kinds = ["platform", "storage", "replica", "disk"] if self.plat is not None else ["storage", "disk"]
        turn = 0
        while not self.stop.wait(rng.expovariate(1 / self.every)):
            if self.s.service.proc.poll() is not None:
                self.s.unexpected_exits += 1
                self.violation(f"the storage exited by itself ({self.s.service.proc.returncode})")
                self.s.start()
            if self.plat is not None and not self.plat.p.alive():
                self.violation(f"the platform exited by itself ({self.plat.p.service.proc.returncode})")
                self.plat.p.start()
            kind = kinds[turn % len(kinds)]
            turn += 1
            if kind == "storage":
                self.faults["kill -9 of the storage"] += 1
                self.s.kill9()
                self.stop.wait(rng.uniform(0, 0.5))  # down a moment: clients meet a refused port
                self.s.start()
            elif kind == "disk":
                self.faults["disk full (RLIMIT_FSIZE 256 KiB), then freed"] += 1
                self.s.disk_full(True)
                self.stop.wait(rng.uniform(0.5, 3.0))
                self.s.disk_full(False)
            elif kind == "platform":
                self.faults["kill -9 of the platform"] += 1
                self.plat.kill_platform(rng.uniform(0, 0.5))
            elif self.plat.kill_replica():
                self.faults["kill -9 of a replica"] += 1

    # ---- the run and the final check ------------------------------------------------------------
    def run(self) -> float:
        for b in (BUCKET, *DELETE_BUCKETS):
            self.answered("POST", f"{self.s.url}/storage/v1/b", json={"name": b})
        workers = [self.writer, self.writer, self.reader, self.reader, self.copier, self.unique_writer,
                   self.resumable, self.resumable]
        for b in DELETE_BUCKETS:
            workers += [lambda b=b: self.bucket_uploader(b), lambda b=b: self.bucket_uploader(b),
                        lambda b=b: self.bucket_deleter(b)]
        if self.plat is not None:
            self.plat.deploy()
            workers += [self.plat.registry, self.plat.submitter, self.plat.predictor]
        threads = [threading.Thread(target=self._guarded, args=(w,), daemon=True) for w in workers]
        nemesis = threading.Thread(target=self._guarded, args=(self.nemesis,), daemon=True)
        started = time.monotonic()
        for t in threads:
            t.start()
        nemesis.start()
        try:
            self.stop.wait(self.seconds)
            # A short run goes on until every kind of fault struck once (at most two minutes more).
            kinds = 4 if self.plat is not None else 2
            overtime = time.monotonic() + 120
            while len(self.faults) < kinds and time.monotonic() < overtime and not self.stop.wait(0.2):
                pass
        except KeyboardInterrupt:  # Ctrl-C: the nemesis must not start the storage again once it is stopped
            self.stop.set()
            nemesis.join(60)
            raise
        self.stop.set()
        for t in [*threads, nemesis]:
            t.join(REQUEST_TIMEOUT_S * 5)
            if t.is_alive():
                self.violation(f"a client thread did not finish ({t.name})")
        elapsed = time.monotonic() - started
        if self.s.service.proc.poll() is not None:
            self.s.start()
        self.s.disk_full(False)
        if self.plat is not None:  # first: the last fault's recovery is measured as the clients would see it
            self.plat.final_check()
        self.final_check()
        return elapsed

    def _guarded(self, work) -> None:
        try:
            work()
        except Exception as exc:  # a checker bug must show, not end a thread quietly
            self.violation(f"client error: {type(exc).__name__}: {exc}")

    def final_check(self) -> None:
        self.lost = self.corrupted = 0
        for key, crc in sorted(self.unique_acked.items()):
            bucket, name = key.split("/", 1)
            r = self.answered("GET", f"{self.s.url}/download/storage/v1/b/{bucket}/o/{quote(name, safe='')}",
                              params={"alt": "media"})
            if r.status_code != 200:
                self.lost += 1
                self.violation(f"acknowledged {key} lost ({r.status_code})")
            elif crc_of(r.content) != crc or r.headers["x-goog-hash"].split("crc32c=")[1].split(",")[0] != crc:
                self.corrupted += 1
                self.violation(f"acknowledged {key} reads back with CRC32C {crc_of(r.content)}, acknowledged {crc}")
        for name, (gen, crc) in sorted(self.last_acked.items()):
            r = self.answered("GET", f"{self.s.url}/download/storage/v1/b/{BUCKET}/o/{quote(name, safe='')}",
                              params={"alt": "media"})
            final = int(r.headers.get("x-goog-generation", 0)) if r.status_code == 200 else 0
            if final < gen:
                self.lost += 1
                self.violation(f"{name}: generation {final} after generation {gen} was acknowledged")
            elif final == gen and crc_of(r.content) != crc:
                self.corrupted += 1
                self.violation(f"{name}#{gen} reads back with CRC32C {crc_of(r.content)}, acknowledged {crc}")


def orphans(root: Path, keep: set[int]) -> list[int]:
    """Processes (other than ``keep``) whose command line names ``root`` or whose working directory is
    under it (a job's process names neither the platform nor its state directory: it runs in its job's)."""
    found = []
    marker = str(root).encode()
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) not in keep:
            try:
                if marker in (d / "cmdline").read_bytes() or os.readlink(d / "cwd").startswith(str(root)):
                    found.append(int(d.name))
            except OSError:
                continue
    return found


def model_to_serve(model: str | None, instances: str | None) -> tuple[str, bytes]:
    """(a model version directory, a predict body for it): ``--model``/``--instances``, else the digits demo."""
    if model:
        return model, json.dumps({"instances": json.loads(instances or "[]")}).encode()
    from modelyard import demo

    base = demo.ensure_demo_model(log=lambda m: log(m))
    return str(Path(base) / "0001"), demo.demo_predict_body(1).encode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the schedule (default 60)")
    parser.add_argument("--minutes", type=float, default=None, help="length in minutes (overrides --seconds)")
    parser.add_argument("--every", type=float, default=3.0, help="mean seconds between faults (default 3)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock)")
    parser.add_argument("--storage-only", action="store_true",
                        help="no platform: the storage's clients and faults alone")
    parser.add_argument("--model", default=None,
                        help="the model version directory the platform serves (default: the digits demo's)")
    parser.add_argument("--instances", default=None, help="JSON list of instances to predict with --model")
    parser.add_argument("--out", default=None, help="results file (default bench/results/chaos.md)")
    args = parser.parse_args()
    seconds = args.minutes * 60 if args.minutes is not None else args.seconds
    seed = args.seed if args.seed is not None else int(time.time())
    served = None if args.storage_only else model_to_serve(args.model, args.instances)
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        storage = Storage(Path(tmp))
        storage.start()
        chaos = Chaos(storage, seconds, args.every, seed)
        platform = None
        signal.signal(signal.SIGTERM, lambda *_: chaos.stop.set())  # stop early: still checked and reported
        try:
            if served is not None:
                platform = Platform(Path(tmp) / "platform", storage.url)
                platform.work.mkdir()
                platform.start()
                chaos.plat = PlatformChaos(chaos, platform, served[0], served[1], seed)
            elapsed = chaos.run()
        finally:
            if platform is not None and platform.alive():
                platform.stop_everything()
            storage.stop()
        left = orphans(Path(tmp), {os.getpid()})
        for pid in left:
            chaos.violation(f"orphan process {pid} under the storage root or the platform's state directory")
    kinds = ["write", "read", "copy", "unique write", "resumable", "upload into deleted bucket", "bucket delete"]
    rows = [[k, sum(chaos.ops[k].values()), chaos.ops[k]["ok"], chaos.ops[k]["refused"], chaos.ops[k][FAILED],
             chaos.ops[k][NO_ANSWER]] for k in kinds]
    plat = chaos.plat
    if plat is not None:
        rows += plat.rows()
    checks = [["acknowledged objects checked at the end", len(chaos.unique_acked) + len(chaos.last_acked)],
              ["lost acknowledged objects", chaos.lost], ["corrupted acknowledged objects", chaos.corrupted],
              ["mixed-generation reads", sum("mixed generations" in v for v in chaos.violations)],
              ["compare-and-set violations", sum("conditional" in v or "ifSourceGenerationMatch" in v or "CAS" in v
                                                 for v in chaos.violations)],
              ["bucket delete violations", sum("bucket" in v and ("vanished" in v or "re-created" in v)
                                               for v in chaos.violations)],
              ["stuck requests (no answer in 30 s)", chaos.stuck], ["resumable sessions lost", chaos.sessions_lost]]
    if plat is not None:
        checks += [
            ["acknowledged registry records checked at the end (endpoints, models)", len(plat.endpoints) + len(plat.models)],
            ["acknowledged jobs checked at the end", len(plat.jobs)],
            ["lost registry or job records", plat.lost],
            ["jobs stuck (not final 180 s after the run)", plat.stuck_jobs],
            ["operations stuck (not done 180 s after the run)", plat.stuck_operations],
            ["faults predicts did not recover from (120 s)", plat.not_recovered],
            ["replicas beyond the deployment's one", plat.extra_replicas]]
    checks += [["orphan processes", len(left)], ["violations, all kinds", len(chaos.violations)]]
    faults = [[k, v] for k, v in sorted(chaos.faults.items())] + [["storage starts", storage.starts]]
    if plat is not None:
        faults.append(["platform starts", platform.starts])
    clients = ("2 writers (half compare-and-set), 2 readers, 1 copier, 1 unique writer, 2 resumable uploaders, "
               "2 x (2 uploaders + 1 bucket deleter)")
    if plat is not None:
        clients += ("; on the platform: 1 registry client (endpoint creates, every 10th a model upload), 1 job "
                    "submitter (a CustomJob every 1-3 s, 30 % cancelled), 1 predict client (back to back, one "
                    "replica deployed)")
    text = "\n\n".join([
        "# Fault schedule: the platform, its Cloud Storage and its replicas under kill -9 and a full disk"
        if plat is not None else "# Fault schedule: the platform's Cloud Storage under kill -9 and a full disk",
        machine(),
        f"`{command_line()}` (seed {seed}): {elapsed:.0f} s; clients: {clients}; a fault every "
        f"{args.every:g} s on average, the kinds in turn. Full disk: RLIMIT_FSIZE {DISK_FULL_BYTES >> 10} KiB on "
        "the storage process.",
        markdown_table(["operation", "attempted", "ok", "refused (4xx, as specified)", "failed (5xx: full disk)",
                        "no answer (process down)"], rows),
        markdown_table(["fault", "count"], faults),
        *([markdown_table(["fault", "recoveries", "median s to an answered predict", "longest s"],
                          plat.recovery_rows()),
           f"Predicts: {plat.predicts['ok']} answered 200, {plat.predicts['failed']} not (while a fault lasted)."]
          if plat is not None else []),
        markdown_table(["check", "count"], checks),
        f"Storage throughput under faults: {chaos.bytes_written / elapsed / 1e6:.1f} MB/s acknowledged writes, "
        f"{chaos.bytes_read / elapsed / 1e6:.1f} MB/s reads, "
        f"{sum(c['ok'] for c in chaos.ops.values()) / elapsed:.0f} successful operations/s (all clients).",
        *(["Violations (first 20):\n\n" + "\n".join(f"- {v}" for v in chaos.violations[:20])]
          if chaos.violations else []),
    ])
    write_results("chaos", text, args.out)
    return 1 if chaos.violations else 0


if __name__ == "__main__":
    sys.exit(main())
