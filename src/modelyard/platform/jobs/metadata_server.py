"""A job's metadata server, as Vertex AI gives every training container (the Compute Engine metadata
server's protocol), in one process with the job's storage gateway (``modelyard.tf_gcs``).

Started by the job's process (``job_env.job_identity``) and gone with it. Its address reaches every
process of the job as ``GCE_METADATA_HOST`` / ``GCE_METADATA_IP`` (google-auth: ``google.auth.default()``
finds Compute Engine credentials and the project there; TensorFlow's GCS file system asks it for its
token), and the same port is the job's ``STORAGE_EMULATOR_HOST`` (google-cloud-storage, gcsfs). Answered:

  GET /                                                   the ping (``Metadata-Flavor: Google``)
  GET /computeMetadata/v1/project/project-id              the job's project
  GET /computeMetadata/v1/instance/service-accounts/      ``default/``
  GET /computeMetadata/v1/instance/service-accounts/default/?recursive=true   email, scopes, aliases
  GET /computeMetadata/v1/instance/service-accounts/default/{email,scopes,token}
  GET /computeMetadata/v1/universe/universe-domain        googleapis.com

``token`` is the job's own token (``api.job_tokens``; behind the platform's ``--auth-token``), the same for
every call while the job runs; without ``--auth-token`` a placeholder no one checks. Requests without
``Metadata-Flavor: Google`` get a 403, as on Compute Engine. Other paths go to the storage gateway.

May import: ``modelyard.tf_gcs`` (and what it imports).
"""
from __future__ import annotations

import argparse
import asyncio
import sys

from modelyard import tf_gcs

PREFIX = "/computeMetadata/v1/"
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
NO_AUTH_TOKEN = "modelyard-no-auth"  # the platform has no --auth-token: nothing checks it
TOKEN_LIFETIME_S = 3599  # what clients are told; the token itself lives as long as its job


def answer(path: str, query: dict, headers, project: str, email: str, token: str | None) -> tuple[int, object]:
    """(status, body) of one metadata request: a dict body is JSON, a str is text."""
    if headers.get("Metadata-Flavor", "").lower() != "google" or "X-Forwarded-For" in headers:
        return 403, "Missing required header \"Metadata-Flavor\": \"Google\""
    if path in ("", "/"):
        return 200, "computeMetadata/\n"
    if not path.startswith(PREFIX):
        return 404, "Not Found"
    key = path[len(PREFIX):]
    account = {"aliases": ["default"], "email": email, "scopes": SCOPES}
    accounts = ("instance/service-accounts/default/", f"instance/service-accounts/{email}/")
    if key == "project/project-id":
        return 200, project
    if key == "universe/universe-domain":
        return 200, "googleapis.com"
    if key == "instance/service-accounts/" or key == "instance/service-accounts":
        return 200, f"default/\n{email}/\n"
    for base in accounts:
        if key in (base, base.rstrip("/")):
            return 200, account if query.get("recursive", "").lower() == "true" else "aliases\nemail\nscopes\ntoken\n"
        if key == base + "email":
            return 200, email
        if key == base + "aliases":
            return 200, "default\n"
        if key == base + "scopes":
            return 200, "\n".join(SCOPES) + "\n"
        if key == base + "token":
            return 200, {"access_token": token or NO_AUTH_TOKEN, "expires_in": TOKEN_LIFETIME_S,
                         "token_type": "Bearer"}
    return 404, "Not Found"


class MetadataGateway(tf_gcs.Gateway):
    """The storage gateway whose plain port answers the metadata paths too."""

    def __init__(self, *, project: str, email: str, **gateway) -> None:
        super().__init__(**gateway)
        self.project, self.email = project, email

    async def handle(self, request):
        from aiohttp import web

        if request.path == "/" or request.path.startswith("/computeMetadata/"):
            status, body = answer(request.path, dict(request.query), request.headers, self.project, self.email,
                                  self.token)
            headers = {"Metadata-Flavor": "Google"}
            if isinstance(body, dict):
                return web.json_response(body, status=status, headers=headers)
            return web.Response(text=body, status=status, headers=headers, content_type="application/text")
        return await super().handle(request)


def service_account(project: str) -> str:
    """The job's service account's email, shaped like Vertex's custom-code service agent."""
    return f"custom-code@{project}.iam.gserviceaccount.com"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modelyard.platform.jobs.metadata_server")
    tf_gcs.add_arguments(parser)
    parser.add_argument("--project", required=True)
    args = parser.parse_args(argv)
    asyncio.run(tf_gcs._serve(MetadataGateway(**tf_gcs.gateway_args(args), project=args.project,
                                              email=service_account(args.project))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
