"""Device slots: which cores or GPU each running trial owns, so parallel trials never share one.

``--devices`` forms:

- ``auto`` (default): one GPU per trial if the NVIDIA driver shows GPUs, else ``cpu``;
- ``cpu``: this process's cores split into ``parallel_trial_count`` disjoint sets;
- ``cpu:0,1`` one core per trial; ``cpu:0-3,4-7`` a set per trial;
- ``gpu:0,1`` one GPU per trial (``CUDA_VISIBLE_DEVICES``);
- ``none``: no pinning (trials share everything).

A CPU slot is applied twice: the process's affinity (``sched_setaffinity``, inherited by
every thread and child), and thread-count variables TensorFlow and the BLAS libraries read,
so they size their pools to the slot instead of to the whole machine.
"""
from __future__ import annotations

import os
from dataclasses import dataclass


class DeviceError(ValueError):
    """The --devices value is wrong or asks for cores this process cannot use."""


@dataclass(frozen=True)
class Slot:
    """One trial's share of the machine."""

    kind: str  # cpu | gpu | none
    ids: tuple[int, ...] = ()

    def env(self) -> dict[str, str]:
        """Variables the trial's process gets for this slot."""
        if self.kind == "gpu":
            return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, self.ids))}
        if self.kind == "none":
            return {}
        n = str(len(self.ids))
        return {
            "CUDA_VISIBLE_DEVICES": "",  # a CPU trial must not take a GPU another trial owns
            "TF_NUM_INTRAOP_THREADS": n,
            "TF_NUM_INTEROP_THREADS": "1" if len(self.ids) < 4 else "2",
            "OMP_NUM_THREADS": n,
            "MKL_NUM_THREADS": n,
            "OPENBLAS_NUM_THREADS": n,
            "MODELYARD_TRIAL_CPUS": ",".join(map(str, self.ids)),
        }

    @property
    def cpus(self) -> set[int] | None:
        """Cores to pin the trial's process to, or None."""
        return set(self.ids) if self.kind == "cpu" else None

    def describe(self) -> str:
        if self.kind == "none":
            return "-"
        return f"{self.kind} {','.join(map(str, self.ids))}"


def _ints(text: str) -> tuple[int, ...]:
    if "-" in text:
        low, _, high = text.partition("-")
        if not (low.isdigit() and high.isdigit()) or int(low) > int(high):
            raise DeviceError(f"--devices: bad range {text!r}; write 0-3")
        return tuple(range(int(low), int(high) + 1))
    if not text.isdigit():
        raise DeviceError(f"--devices: bad device number {text!r}")
    return (int(text),)


def parse(text: str | None, parallel: int) -> list[Slot]:
    """Slots for ``--devices``; as many as can run at once (may be fewer than ``parallel``)."""
    text = (text or "auto").strip().lower()
    if text == "auto":
        gpus = visible_gpus()
        text = f"gpu:{','.join(map(str, gpus))}" if gpus else "cpu"
    if text == "none":
        return [Slot("none")] * parallel
    kind, _, rest = text.partition(":")
    if kind not in ("cpu", "gpu"):
        raise DeviceError(f"--devices: {text!r}; use cpu, cpu:0,1, cpu:0-1,2-3, gpu:0,1 or none")
    available = sorted(os.sched_getaffinity(0))
    if kind == "cpu" and not rest:
        if parallel > len(available):
            raise DeviceError(f"--devices cpu: {parallel} parallel trials need {parallel} cores, this process may "
                              f"use {len(available)} ({available}); lower parallel_trial_count or give --devices none")
        size = len(available) // parallel
        return [Slot("cpu", tuple(available[i * size:(i + 1) * size])) for i in range(parallel)]
    if not rest:
        raise DeviceError("--devices gpu: name the GPUs, e.g. gpu:0,1")
    slots = [Slot(kind, _ints(part.strip())) for part in rest.split(",") if part.strip()]
    used = [i for slot in slots for i in slot.ids]
    if len(used) != len(set(used)):
        raise DeviceError(f"--devices: {text!r} gives a device to two slots; slots must be disjoint")
    if kind == "cpu":
        missing = sorted(set(used) - set(available))
        if missing:
            raise DeviceError(f"--devices: core(s) {missing} are not available to this process (it may use {available})")
    return slots


def visible_gpus() -> list[int]:
    """GPU indices the NVIDIA driver lists (without starting CUDA or TensorFlow), narrowed by an
    inherited CUDA_VISIBLE_DEVICES of plain indices."""
    from pathlib import Path

    driver = Path("/proc/driver/nvidia/gpus")
    count = len(list(driver.iterdir())) if driver.is_dir() else 0
    gpus = list(range(count))
    inherited = os.environ.get("CUDA_VISIBLE_DEVICES")
    if inherited is not None and all(p.strip().isdigit() for p in inherited.split(",") if p.strip()):
        gpus = [int(p) for p in inherited.split(",") if p.strip() and int(p) < count]
    return gpus


class SlotPool:
    """Free slots; a trial takes one when it starts and gives it back when its process is gone."""

    def __init__(self, slots: list[Slot], parallel: int):
        self.free = list(slots[:parallel])
        self.size = len(self.free)

    def take(self) -> Slot | None:
        return self.free.pop(0) if self.free else None

    def give_back(self, slot: Slot) -> None:
        self.free.append(slot)
