"""Prometheus metrics of the gateway, per endpoint and deployed model, in the text exposition format.

Requests by status code, a latency histogram, replicas by state, requests in flight, and for shadow
deployments the mirrored requests, how many agreed with the served answer, and the largest absolute
difference seen. Written out on ``GET /metrics``; no client library needed for this small set.
"""
from __future__ import annotations

import bisect
from collections import defaultdict

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self) -> None:
        self.requests: dict[tuple, int] = defaultdict(int)  # (endpoint, dm, code) -> count
        self.latency: dict[tuple, list] = {}  # (endpoint, dm) -> [bucket counts..., sum, count]
        self.shadow: dict[tuple, list] = {}  # (endpoint, dm) -> [mirrored, agreed, failed, max_abs_diff]

    def observe_predict(self, d, status: int, seconds: float) -> None:
        key = (d.endpoint_id, d.id)
        self.requests[key + (status,)] += 1
        h = self.latency.get(key)
        if h is None:
            h = self.latency[key] = [0] * (len(BUCKETS) + 2)
        h[bisect.bisect_left(BUCKETS, seconds)] += 1
        h[-2] += seconds
        h[-1] += 1

    def observe_shadow(self, d, agreed: bool | None, max_abs_diff: float) -> None:
        s = self.shadow.setdefault((d.endpoint_id, d.id), [0, 0, 0, 0.0])
        s[0] += 1
        if agreed is None:
            s[2] += 1
            return
        s[1] += int(agreed)
        s[3] = max(s[3], max_abs_diff)

    def render(self, routing) -> str:
        out: list[str] = []

        def family(name: str, kind: str, help_: str) -> None:
            out.append(f"# HELP {name} {help_}\n# TYPE {name} {kind}")

        family("modelyard_endpoint_requests_total", "counter", "predict requests answered, by HTTP status")
        for (ep, dm, code), n in sorted(self.requests.items()):
            out.append(f'modelyard_endpoint_requests_total{{endpoint="{ep}",deployed_model="{dm}",code="{code}"}} {n}')
        family("modelyard_endpoint_request_seconds", "histogram", "predict latency through the gateway")
        for (ep, dm), h in sorted(self.latency.items()):
            labels = f'endpoint="{ep}",deployed_model="{dm}"'
            acc = 0
            for bound, n in zip(BUCKETS, h):
                acc += n
                out.append(f'modelyard_endpoint_request_seconds_bucket{{{labels},le="{bound}"}} {acc}')
            out.append(f'modelyard_endpoint_request_seconds_bucket{{{labels},le="+Inf"}} {h[-1]}')
            out.append(f"modelyard_endpoint_request_seconds_sum{{{labels}}} {h[-2]:.6f}")
            out.append(f"modelyard_endpoint_request_seconds_count{{{labels}}} {h[-1]}")
        family("modelyard_deployed_model_replicas", "gauge", "replicas by state")
        family("modelyard_deployed_model_in_flight", "gauge", "requests in flight at the replicas")
        for d in routing.deployed.values():
            labels = f'endpoint="{d.endpoint_id}",deployed_model="{d.id}"'
            states = {"serving": 0, "draining": 0}
            for r in d.replicas:
                if not r.dead:
                    states["draining" if r.draining else "serving"] += 1
            for state, n in states.items():
                out.append(f'modelyard_deployed_model_replicas{{{labels},state="{state}"}} {n}')
            out.append(f"modelyard_deployed_model_in_flight{{{labels}}} {d.in_flight()}")
        family("modelyard_shadow_requests_total", "counter", "requests mirrored to a shadow deployed model")
        family("modelyard_shadow_agreements_total", "counter", "mirrored requests whose answer agreed (same top class per instance)")
        family("modelyard_shadow_failures_total", "counter", "mirrored requests the shadow failed to answer")
        family("modelyard_shadow_agreement_ratio", "gauge", "agreements / answered mirrored requests")
        family("modelyard_shadow_max_abs_diff", "gauge", "largest absolute difference between shadow and served predictions")
        for (ep, dm), (n, agreed, failed, diff) in sorted(self.shadow.items()):
            labels = f'endpoint="{ep}",deployed_model="{dm}"'
            out.append(f"modelyard_shadow_requests_total{{{labels}}} {n}")
            out.append(f"modelyard_shadow_agreements_total{{{labels}}} {agreed}")
            out.append(f"modelyard_shadow_failures_total{{{labels}}} {failed}")
            answered = n - failed
            out.append(f"modelyard_shadow_agreement_ratio{{{labels}}} {agreed / answered if answered else 0:.6f}")
            out.append(f"modelyard_shadow_max_abs_diff{{{labels}}} {diff:.9g}")
        return "\n".join(out) + "\n"
