"""One JSON request to the platform's REST API with the standard library: the body as JSON, the bearer token
when there is one, the answer parsed (an empty answer reads as ``{}``). HTTP and connection errors are raised
as urllib raises them: each caller says them in its own words (the CLI's, a job's, a tuning run's)."""
from __future__ import annotations

import json
import urllib.request


def json_request(method: str, url: str, body: dict | None = None, token: str | None = None,
                 timeout: float = 60.0) -> dict:
    """``method url`` with ``body``; the parsed JSON answer. Raises urllib.error.HTTPError / URLError."""
    request = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return json.loads(answer.read() or b"{}")
