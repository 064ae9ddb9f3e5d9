"""Cloud Storage benchmark: the platform's own storage API against `cp` on the same disk and against
gcp-storage-emulator, through the stock `google-cloud-storage` client.

    python3 bench/storage.py            # 3 turns, a 200 MB model directory, the 1 GB memory check
    python3 bench/storage.py --quick    # 1 turn (writes bench/results/storage-quick.md)
    python3 bench/storage.py --small --out /tmp/storage.md   # 1 turn, 10 MB directory, 64 MB object: checks it runs

One `modelyard platform` (temporary store, no warm spare: nothing but the control plane and its
storage child) and one `gcp-storage-emulator` (its default on-disk mode) run side by side. A model
directory of 200 MB (two large variable shards, a graph file and a few small files, random bytes) is
uploaded (`Blob.upload_from_filename`, one call per file as `aiplatform`'s `upload_directory` does) and
downloaded (`Blob.download_to_filename`), both with the client's default CRC32C check, against each
server; `cp -r` copies the same directory to and back from another directory on the same disk; and,
to tell the server's cost from the Python client's, curl uploads and downloads the same files from
the platform's storage. The client ceiling: the same client and curl against `null_storage.py`, a
server that does no storage work (bodies read and dropped, downloads sent from memory with the
precomputed CRC32C the client checks): the most any server can give this client on this host; and
the same server with `--store`, which writes each upload to a file and CRC32C-hashes it, the least
any store does.
All take turns each round (harness.take_turns), so drift on the shared machine hits all alike;
medians are reported.

Memory: a 1 GB file is uploaded (the client's default resumable upload, 100 MB chunks) to each server,
and the peak resident size (VmHWM) of the process holding the storage is read from /proc afterwards:
the platform's storage process (and the platform itself), and the emulator's.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import (RESULTS, Service, children_cpu_seconds, env, free_port, http_ok, log, machine, markdown_table,
                     median, modelyard_platform, take_turns, tree_cpu_seconds, write_results)

MB = 1 << 20
# The model directory: sizes in MB (200 in all), shaped like a SavedModel with sharded variables.
LAYOUT = {"saved_model.pb": 6.0, "fingerprint.pb": 0.001, "variables/variables.index": 0.05,
          "variables/variables.data-00000-of-00002": 120.0, "variables/variables.data-00001-of-00002": 73.0,
          "assets/vocab.txt": 0.9, "assets.extra/tf_serving_warmup_requests": 0.049}


def write_random(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(16 * MB, left)
            f.write(os.urandom(n))
            left -= n


def status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def child_pid(parent: int, marker: str) -> int:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent and marker.encode() in cmd:
                return int(entry)
    raise RuntimeError(f"no child of {parent} running {marker}")


class Servers:
    """The platform (its storage child measured), the emulator and the null server (serving ``src``),
    each a harness Service."""

    def __init__(self, work: Path, src: Path) -> None:
        child_env = env()
        child_env.pop("STORAGE_EMULATOR_HOST", None)
        self.storage_port, emu_port, null_port, store_port = free_port(), free_port(), free_port(), free_port()
        self.platform = modelyard_platform(work, "--storage-port", str(self.storage_port), "--no-warm-spare",
                                           child_env=child_env, timeout=60)
        (work / "emulator").mkdir()
        self.urls = {"modelyard": f"http://127.0.0.1:{self.storage_port}", "emulator": f"http://127.0.0.1:{emu_port}",
                     "null": f"http://127.0.0.1:{null_port}", "null-store": f"http://127.0.0.1:{store_port}"}
        self.emulator = Service("gcp-storage-emulator", [sys.executable, "-m", "gcp_storage_emulator", "start",
                                                         "--host=127.0.0.1", f"--port={emu_port}", "-q"],
                                work / "emulator.log", ready=http_ok(self.urls["emulator"] + "/storage/v1/b"),
                                env=child_env, cwd=work / "emulator", timeout=60)
        self.null = Service("null storage (client ceiling)",
                            [sys.executable, str(Path(__file__).with_name("null_storage.py")), f"--port={null_port}",
                             f"--objects={src}"], work / "null.log", ready=http_ok(self.urls["null"] + "/storage/v1/b"),
                            env=child_env, timeout=60)
        self.null_store = Service("null storage --store (a minimal store)",
                                  [sys.executable, str(Path(__file__).with_name("null_storage.py")),
                                   f"--port={store_port}", f"--objects={src}", f"--store={work / 'null-store'}"],
                                  work / "null-store.log", ready=http_ok(self.urls["null-store"] + "/storage/v1/b"),
                                  env=child_env, timeout=60)
        try:
            self.platform.start()
            self.emulator.start()
            self.null.start()
            self.null_store.start()
        except BaseException:
            self.stop()
            raise
        self.storage_pid = child_pid(self.platform.pid, "modelyard.platform.storage")

    def stop(self) -> None:
        self.platform.stop(30)
        self.emulator.stop(30)
        self.null.stop(30)
        self.null_store.stop(30)


def client(url: str):
    import google.auth.credentials
    from google.cloud import storage

    os.environ["STORAGE_EMULATOR_HOST"] = url  # read when the client is made
    c = storage.Client(project="local", credentials=google.auth.credentials.AnonymousCredentials())
    os.environ.pop("STORAGE_EMULATOR_HOST")
    return c


def upload_dir(bucket, src: Path, prefix: str) -> None:
    for p in sorted(src.rglob("*")):
        if p.is_file():
            bucket.blob(f"{prefix}/{p.relative_to(src).as_posix()}").upload_from_filename(str(p))


def download_dir(bucket, prefix: str, dest: Path) -> None:
    for blob in bucket.list_blobs(prefix=prefix + "/"):
        path = dest / blob.name[len(prefix) + 1:]
        path.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(path))


def curl_upload_dir(url: str, bucket: str, src: Path, prefix: str) -> None:
    """The same uploads by curl (a C client), one simple upload per file, streamed from the file (``-T``;
    ``--data-binary @file`` would read each file whole into curl's memory first): what the server does
    without the Python client's own costs."""
    from urllib.parse import quote

    for p in sorted(src.rglob("*")):
        if p.is_file():
            name = quote(f"{prefix}/{p.relative_to(src).as_posix()}", safe="")
            subprocess.run(["curl", "-sf", "-o", "/dev/null", "-X", "POST", "-T", str(p),
                            "-H", "Content-Type: application/octet-stream",
                            f"{url}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}"], check=True)


def curl_download_dir(url: str, bucket: str, src: Path, prefix: str, dest: Path) -> None:
    from urllib.parse import quote

    for p in sorted(src.rglob("*")):
        if p.is_file():
            rel = p.relative_to(src).as_posix()
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["curl", "-sf", "-o", str(dest / rel),
                            f"{url}/download/storage/v1/b/{bucket}/o/{quote(f'{prefix}/{rel}', safe='')}?alt=media"],
                           check=True)


def snap(server_pid: int | None) -> tuple[float, float, float]:
    """(wall clock, CPU seconds of this process and its finished children (cp, curl), of the server)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    return (time.perf_counter(), me.ru_utime + me.ru_stime + children_cpu_seconds(),
            tree_cpu_seconds(server_pid) if server_pid else 0.0)


def same_tree(a: Path, b: Path) -> bool:
    fa = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    fb = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    return fa == fb and all((a / p).stat().st_size == (b / p).stat().st_size for p in fa)


NOTES = """Reading the figures: the CPU columns say where the time goes. A download through
google-cloud-storage costs the client 0.6-1 CPU second per 200 MB because it reads the body 8 KiB at
a time (`_SINGLE_GET_CHUNK_SIZE`), writing and checksumming each piece; the storage process sends the
file with the kernel's sendfile and spends well under a tenth of that. An upload costs the server about
as much CPU as the client (receive, write, CRC32C). cp moves the same bytes with a few large kernel
copies. On a 2-core machine shared with other work (see the load average) every extra CPU second is
paid in wall time, so the ratios to cp are set mostly by the client's own cost; the curl row is the
same server with a C client.

The client ceiling row is what google-cloud-storage reaches when the server costs nothing (null_storage.py
reads upload bodies into one reused buffer and drops them, and sends downloads from memory, with the
same checksum headers): no server, however fast, can give this client more on this host. cp is no
such bound: it moves page cache to page cache in the kernel, while every client here also pays a
loopback TCP connection, HTTP framing and its own Python per-chunk work. A storage server is judged
by the share of that ceiling it keeps (the two "client ceiling" checks). Downloads are sent with sendfile and cost
the server almost nothing, so they sit near the ceiling; an upload is received through aiohttp (a
copy out of the socket, one more in its HTTP parser), written to the page cache and CRC32C-hashed,
which the null server skips: compare the server CPU seconds, and the two curl rows, where a client
that costs little leaves the server's own receive rate exposed. The `--store` row is the null server
doing just that much (each upload written to a file and CRC32C-hashed, in plain Python with one reused
connection thread): how far from the ceiling storing the bytes alone puts any server on this host."""


def with_earlier_runs(text: str, path: Path) -> str:
    """The new run on top and the file's earlier runs below it, each under an '## Earlier run' heading."""
    if not path.exists():
        return text
    old = path.read_text()
    title = text.splitlines()[0]
    if old.startswith(title):
        old = "## Earlier run" + old[len(title):]
    return text.rstrip("\n") + "\n\n" + old


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--big-mb", type=int, default=1024, help="size of the memory check's object (default 1024)")
    ap.add_argument("--small", action="store_true",
                    help="1 turn, the directory 1/20 the size, a 64 MB object: checks it runs, not a measurement")
    ap.add_argument("--out", help="results file or folder (default bench/results/storage.md, or storage-quick.md)")
    args = ap.parse_args()
    scale = 1.0
    if args.quick or args.small:
        args.rounds = 1
    if args.small:
        scale, args.big_mb = 1 / 20, min(args.big_mb, 64)
    load_before = " / ".join(Path("/proc/loadavg").read_text().split()[:3])
    started_on = machine()
    work = Path(tempfile.mkdtemp(prefix="storage-bench-", dir=os.environ.get("BENCH_TMP")))
    src = work / "model"
    for rel, mb in LAYOUT.items():
        write_random(src / rel, int(mb * scale * MB))
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    names = ("cp", "modelyard", "emulator", "modelyard-curl", "null", "null-curl", "null-store")
    runs: dict[str, dict[str, list[float]]] = {k: {"up": [], "down": []} for k in names}
    cpu: dict[str, dict[str, list[tuple[float, float]]]] = {k: {"up": [], "down": []} for k in names}
    servers = None
    try:
        servers = Servers(work, src)
        buckets = {}
        for name in ("modelyard", "emulator", "null", "null-store"):
            c = client(servers.urls[name])
            buckets[name] = c.create_bucket(f"bench-{name}")

        def one_turn(name: str, r: int) -> dict:
            back = work / f"back-{name}-{r}"
            spid = {"modelyard": servers.storage_pid, "modelyard-curl": servers.storage_pid,
                    "emulator": servers.emulator.pid, "null": servers.null.pid, "null-curl": servers.null.pid,
                    "null-store": servers.null_store.pid}.get(name)
            if name == "cp":
                dst = work / f"cp-{r}"
                t0 = snap(spid)
                subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
                t1 = snap(spid)
                subprocess.run(["cp", "-r", str(dst), str(back)], check=True)
                t2 = snap(spid)
                shutil.rmtree(dst)
            elif name.endswith("-curl"):
                server = name.removesuffix("-curl")
                t0 = snap(spid)
                curl_upload_dir(servers.urls[server], f"bench-{server}", src, f"c{r}")
                t1 = snap(spid)
                curl_download_dir(servers.urls[server], f"bench-{server}", src, f"c{r}", back)
                t2 = snap(spid)
                for blob in buckets[server].list_blobs(prefix=f"c{r}/"):
                    blob.delete()
            else:
                bucket = buckets[name]
                t0 = snap(spid)
                upload_dir(bucket, src, f"r{r}")
                t1 = snap(spid)
                download_dir(bucket, f"r{r}", back)
                t2 = snap(spid)
                for blob in bucket.list_blobs(prefix=f"r{r}/"):
                    blob.delete()
            if not same_tree(src, back):
                raise RuntimeError(f"{name}: the copy back differs from the source")
            shutil.rmtree(back)
            return {"up": total / MB / (t1[0] - t0[0]), "down": total / MB / (t2[0] - t1[0]),
                    "cpu_up": (t1[1] - t0[1], t1[2] - t0[2]), "cpu_down": (t2[1] - t1[1], t2[2] - t1[2])}

        def show(name: str, r: int, result: dict) -> None:
            log(f"round {r} {name:14s} up {result['up']:7.0f} MB/s  down {result['down']:7.0f} MB/s")

        for name, results in take_turns(names, args.rounds, one_turn, show).items():
            for result in results:
                for way in ("up", "down"):
                    runs[name][way].append(result[way])
                    cpu[name][way].append(result["cpu_" + way])
        # memory: one large object into each server
        big = work / "big.bin"
        write_random(big, args.big_mb * MB)
        memory = {}
        for name, pid in (("modelyard", servers.storage_pid), ("emulator", servers.emulator.pid)):
            before = status_kb(pid, "VmHWM")
            t0 = time.perf_counter()
            error = ""
            try:
                buckets[name].blob("big.bin").upload_from_filename(str(big))
            except Exception as exc:  # reported in the table: a server that cannot store it is a result
                error = f"{type(exc).__name__}: {str(exc)[:160]}"
            secs = time.perf_counter() - t0
            memory[name] = {"before_mb": before / 1024, "peak_mb": status_kb(pid, "VmHWM") / 1024, "seconds": secs,
                            "error": error}
            log(f"{name}: 1 object of {args.big_mb} MB in {secs:.1f} s, peak RSS {memory[name]['peak_mb']:.0f} MB "
                f"{error}")
        if memory["modelyard"]["error"]:
            raise RuntimeError(f"the platform's storage failed the large object: {memory['modelyard']['error']}")
        memory["platform"] = {"peak_mb": status_kb(servers.platform.pid, "VmHWM") / 1024}
        on_disk = work / "state" / "storage" / "bench-modelyard" / "big.bin"
        if on_disk.stat().st_size != args.big_mb * MB:
            raise RuntimeError("the large object is not on disk whole")
    finally:
        if servers is not None:
            servers.stop()
        shutil.rmtree(work, ignore_errors=True)

    def med(name: str, way: str) -> float:
        return median(runs[name][way])

    import google.cloud.storage as gcs_mod

    emu_version = subprocess.run([sys.executable, "-m", "pip", "show", "gcp-storage-emulator"], capture_output=True,
                                 text=True).stdout.split("Version: ")[-1].split()[0]
    rows = [("`cp -r` on the same disk", med("cp", "up"), med("cp", "down")),
            ("modelyard platform storage", med("modelyard", "up"), med("modelyard", "down")),
            (f"gcp-storage-emulator {emu_version}", med("emulator", "up"), med("emulator", "down")),
            ("modelyard platform storage, driven by curl instead (the server alone)", med("modelyard-curl", "up"),
             med("modelyard-curl", "down")),
            ("**client ceiling**: google-cloud-storage against a server doing no work (null_storage.py)",
             med("null", "up"), med("null", "down")),
            ("curl against the same null server (loopback HTTP with a C client)", med("null-curl", "up"),
             med("null-curl", "down")),
            ("google-cloud-storage against the null server with `--store` (writes each upload to a file, CRC32C)",
             med("null-store", "up"), med("null-store", "down"))]

    def cpu_cell(name: str, way: str) -> str:
        client_s = median(c for c, _ in cpu[name][way])
        server_s = median(s for _, s in cpu[name][way])
        return f"{client_s:.2f} + {server_s:.2f}"

    table = markdown_table(
        [f"{total / MB:.0f} MB model directory, {len(LAYOUT)} files", "upload MB/s", "download MB/s", "upload / cp",
         "download / cp", "CPU s up (client + server)", "CPU s down (client + server)"],
        [(label, f"{up:,.0f}", f"{down:,.0f}", f"{up / med('cp', 'up'):.2f}x", f"{down / med('cp', 'down'):.2f}x",
          cpu_cell(name, "up"), cpu_cell(name, "down")) for (label, up, down), name in zip(rows, names)])
    up_ratio, down_ratio = med("modelyard", "up") / med("cp", "up"), med("modelyard", "down") / med("cp", "down")
    up_ceil, down_ceil = med("modelyard", "up") / med("null", "up"), med("modelyard", "down") / med("null", "down")
    peak = memory["modelyard"]["peak_mb"]
    emulator_failed = f" (the upload failed: `{memory['emulator']['error']}`)" if memory["emulator"]["error"] else ""
    mem_table = markdown_table(
        [f"storing one {args.big_mb} MB object", "seconds", "peak RSS (VmHWM)"],
        [("modelyard storage process", f"{memory['modelyard']['seconds']:.1f}", f"{peak:.0f} MB"),
         ("modelyard platform process (control plane)", "", f"{memory['platform']['peak_mb']:.0f} MB"),
         ("gcp-storage-emulator", f"{memory['emulator']['seconds']:.1f}",
          f"{memory['emulator']['peak_mb']:.0f} MB{emulator_failed}")])
    checks = markdown_table(["check", "measured", "target", ""], [
        ("modelyard upload / cp", f"{up_ratio:.2f}x", ">= 0.5x", "PASS" if up_ratio >= 0.5 else "FAIL"),
        ("modelyard download / cp", f"{down_ratio:.2f}x", ">= 0.5x", "PASS" if down_ratio >= 0.5 else "FAIL"),
        ("modelyard upload / client ceiling (proposed target)", f"{up_ceil:.2f}x", ">= 0.8x",
         "PASS" if up_ceil >= 0.8 else "FAIL"),
        ("modelyard download / client ceiling (proposed target)", f"{down_ceil:.2f}x", ">= 0.8x",
         "PASS" if down_ceil >= 0.8 else "FAIL"),
        ("(for reference) modelyard upload / null server with `--store`",
         f"{med('modelyard', 'up') / med('null-store', 'up'):.2f}x", "", ""),
        (f"storage peak RSS storing {args.big_mb} MB", f"{peak:.0f} MB", "< 200 MB", "PASS" if peak < 200 else "FAIL")],
        align="lrll")
    text = "\n".join([
        "# Cloud Storage benchmark (bench/storage.py)", "",
        f"{started_on}; google-cloud-storage {gcs_mod.__version__}; {args.rounds} turn(s), medians; load average "
        f"before the run {load_before}. CPU seconds: the client side (this process, or cp/curl) + the server process.",
        "", table, "", mem_table, "", checks, "",
        NOTES, "",
        "Per run (MB/s): " + json.dumps({k: {w: [round(x) for x in v] for w, v in d.items()} for k, d in runs.items()})])
    if args.out is None and not args.quick:
        text = with_earlier_runs(text, RESULTS / "storage.md")
    write_results("storage-quick" if args.quick else "storage", text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
