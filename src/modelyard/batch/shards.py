"""The job's output files and its commit log: one atomically renamed part per chunk, then shards.

A chunk's rows are written to ``.parts/`` as an errors part and then a results part, each
through a temporary file and ``os.replace``; the results part's rename is the commit, and
its name carries the chunk's counts (``c000012-ok9997-err3.results``), so the list of
committed parts *is* the progress record. A chunk redone after a crash overwrites its own
uncommitted errors part, so each row lands exactly once.

When every chunk is committed, ``finalize`` writes its rename plan atomically, then renames
the non-empty result parts to ``prediction.results-0000K-of-0000N`` and joins the error parts
into ``prediction.errors_stats-00000-of-00001``; every step is idempotent, so a crash during
finalize is finished by the next run.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterator

import orjson

RESULTS_PREFIX = "prediction.results"
ERRORS_FILE = "prediction.errors_stats-00000-of-00001"
PARTS_DIR = ".parts"
FINALIZE_PLAN = ".finalize.json"
_COMMITTED = re.compile(r"^c(\d{6})-ok(\d+)-err(\d+)\.results$")


def _atomic_write(path: Path, lines: list[bytes] | bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        if isinstance(lines, bytes):
            f.write(lines)
        elif lines:
            f.write(b"\n".join(lines))
            f.write(b"\n")
    os.replace(tmp, path)


def write_json(path: Path, data: dict) -> None:
    """Replace ``path`` with ``data`` atomically (readers never see half a file)."""
    _atomic_write(path, json.dumps(data, indent=2, sort_keys=True).encode() + b"\n")


def _errors_part(job_dir: Path, index: int) -> Path:
    return job_dir / PARTS_DIR / f"c{index:06d}.errors"


def commit_part(job_dir: Path, index: int, results: list[bytes], errors: list[bytes]) -> None:
    parts = job_dir / PARTS_DIR
    parts.mkdir(exist_ok=True)
    _atomic_write(_errors_part(job_dir, index), errors)
    _atomic_write(parts / f"c{index:06d}-ok{len(results)}-err{len(errors)}.results", results)


def commit_part_data(job_dir: Path, index: int, results: bytes, successes: int, errors: bytes,
                     failures: int) -> None:
    """``commit_part`` for a part made elsewhere (a Ray actor on another machine): its files' bytes
    and counts, written here in the same order (errors part, then the results part's rename)."""
    parts = job_dir / PARTS_DIR
    parts.mkdir(exist_ok=True)
    _atomic_write(_errors_part(job_dir, index), errors)
    _atomic_write(parts / f"c{index:06d}-ok{successes}-err{failures}.results", results)


def results_tmp(job_dir: Path, index: int) -> Path:
    """Where a chunk's results stream before ``commit_streamed`` (finalize clears leftovers)."""
    parts = job_dir / PARTS_DIR
    parts.mkdir(exist_ok=True)
    return parts / f".c{index:06d}.results.tmp-{os.getpid()}"


def commit_streamed(job_dir: Path, index: int, tmp: Path, successes: int, errors: list[bytes]) -> None:
    """``commit_part`` for results already written to ``tmp``: errors part first, then the commit rename."""
    _atomic_write(_errors_part(job_dir, index), errors)
    os.replace(tmp, job_dir / PARTS_DIR / f"c{index:06d}-ok{successes}-err{len(errors)}.results")


def committed(job_dir: Path) -> dict[int, tuple[int, int, str]]:
    """``{chunk index: (successes, failures, part file name)}`` of every committed chunk."""
    found = {}
    parts = job_dir / PARTS_DIR
    if parts.is_dir():
        for name in os.listdir(parts):
            m = _COMMITTED.match(name)
            if m:
                found[int(m.group(1))] = (int(m.group(2)), int(m.group(3)), name)
    return found


def shard_name(k: int, n: int) -> str:
    return f"{RESULTS_PREFIX}-{k:05d}-of-{n:05d}"


def finalize(job_dir: Path, n_chunks: int) -> dict[str, int]:
    """Turn the committed parts into the final shards and error file; returns the counts."""
    plan_path = job_dir / FINALIZE_PLAN
    if not plan_path.exists():
        done = committed(job_dir)
        missing = [i for i in range(n_chunks) if i not in done]
        if missing:
            raise RuntimeError(f"cannot finalize: {len(missing)} chunks uncommitted (first {missing[0]})")
        ordered = [done[i] for i in range(n_chunks)]
        nonempty = [name for ok, _err, name in ordered if ok]
        plan = {
            "renames": [[name, shard_name(k, len(nonempty))] for k, name in enumerate(nonempty)],
            "error_parts": [f"c{i:06d}.errors" for i in range(n_chunks)],
            "successful_count": sum(ok for ok, _e, _n in ordered),
            "failed_count": sum(err for _o, err, _n in ordered),
        }
        write_json(plan_path, plan)
    plan = json.loads(plan_path.read_text())
    parts = job_dir / PARTS_DIR
    for src, dst in plan["renames"]:
        if (parts / src).exists():
            os.replace(parts / src, job_dir / dst)
    if not (job_dir / ERRORS_FILE).exists():
        tmp = job_dir / f".{ERRORS_FILE}.tmp-{os.getpid()}"
        with open(tmp, "wb") as out:
            for name in plan["error_parts"]:
                with open(parts / name, "rb") as f:
                    out.write(f.read())
        os.replace(tmp, job_dir / ERRORS_FILE)
    if parts.is_dir():
        for name in os.listdir(parts):
            os.unlink(parts / name)
        parts.rmdir()
    plan_path.unlink()
    return {"successful_count": plan["successful_count"], "failed_count": plan["failed_count"]}


def result_shards(job_dir: Path) -> list[Path]:
    return sorted(p for p in job_dir.glob(f"{RESULTS_PREFIX}-*-of-*") if p.is_file())


def iter_lines(paths: list[Path]) -> Iterator[dict]:
    for path in paths:
        with open(path, "rb") as f:
            for line in f:
                if line.strip():
                    yield orjson.loads(line)
