"""Traffic splits: their validation (Vertex AI's rules) and the one weighted choice over them.

A split maps deployed model ids to integer percentages summing to 100 (or is empty when nothing is
deployed). In a deployModel request the key "0" stands for the model being deployed.
"""
from __future__ import annotations

import bisect
import random

from modelyard.platform.api.errors import ApiError, invalid


def validate(split: dict, deployed_ids: set[str], what: str = "traffic_split") -> dict[str, int]:
    """``split`` checked against the endpoint's deployed model ids; zero entries dropped."""
    if not isinstance(split, dict):
        raise invalid(f"{what} must be a map of deployed model id to percentage.")
    out: dict[str, int] = {}
    for key, value in split.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise invalid(f"{what}[{key}] must be an integer percentage, got {value!r}.")
        try:
            pct = int(value)
        except ValueError:
            raise invalid(f"{what}[{key}] must be an integer percentage, got {value!r}.") from None
        if pct != float(value) or not 0 <= pct <= 100:
            raise invalid(f"{what}[{key}] must be an integer between 0 and 100, got {value!r}.")
        if key not in deployed_ids:
            raise ApiError("INVALID_ARGUMENT", f"{what} names deployed model {key}, which is not deployed "
                           "on this endpoint.")
        if pct:
            out[key] = pct
    total = sum(out.values())
    if deployed_ids and total != 100:
        raise invalid(f"{what} must sum to 100, got {total} ({split}).")
    if not deployed_ids and out:
        raise invalid(f"{what} must be empty when no model is deployed.")
    return out


def for_deploy(current: dict[str, int], requested: dict | None, new_id: str, deployed_ids: set[str]) -> dict[str, int]:
    """The endpoint's split after deploying ``new_id`` (key "0" in ``requested`` means ``new_id``)."""
    if not requested:
        return dict(current) if current else {new_id: 100}
    renamed = {(new_id if k == "0" else k): v for k, v in requested.items()}
    return validate(renamed, deployed_ids | {new_id})


def for_undeploy(current: dict[str, int], requested: dict | None, gone: str, deployed_ids: set[str]) -> dict[str, int]:
    """The split after undeploying ``gone``. Vertex's rule: a model that still has traffic can only be
    undeployed alone, or with a new split for the models that stay."""
    remaining = deployed_ids - {gone}
    if requested:
        return validate({k: v for k, v in requested.items() if not (k == gone and not int(v))}, remaining)
    if current.get(gone, 0) and remaining:
        raise ApiError("FAILED_PRECONDITION",
                       f"deployed model {gone} has {current[gone]}% of the endpoint's traffic: give a "
                       "traffic_split for the models that stay, or update the split first.")
    return {k: v for k, v in current.items() if k != gone}


class Chooser:
    """A weighted choice over one split, precomputed for the gateway's hot path."""

    def __init__(self, split: dict[str, int], rng: random.Random | None = None) -> None:
        items = sorted((k, v) for k, v in split.items() if v > 0)
        self.ids = [k for k, _ in items]
        self.bounds: list[int] = []
        acc = 0
        for _, v in items:
            acc += v
            self.bounds.append(acc)
        self.total = acc
        self._random = (rng or random.Random()).random

    def coin(self, percent: int) -> bool:
        """True ``percent``% of the time (shadow mirroring)."""
        return self._random() * 100 < percent

    def choose(self) -> str | None:
        if not self.total:
            return None
        return self.ids[bisect.bisect_right(self.bounds, self._random() * self.total)]
