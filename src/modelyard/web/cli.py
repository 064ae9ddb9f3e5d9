"""``modelyard web SITE [--port N]``: serve a site written by ``modelyard convert --to web``."""
from __future__ import annotations

import sys

from modelyard.cli_parser import examples


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "web",
        help="serve a web site written by `modelyard convert SRC --to web -o SITE` (the model runs in the browser)",
        description="Serve SITE with the headers LiteRT.js needs (application/wasm, cross-origin isolation) and gzip.",
        epilog=examples("modelyard convert models/my_mnist_model --to web -o site/",
                        "modelyard web site/ --port 8080        # then open http://127.0.0.1:8080/"),
    )
    p.add_argument("site", metavar="SITE")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.set_defaults(func=run)


def run(args) -> int:
    from modelyard.web.server import make_server

    try:
        server = make_server(args.site, args.host, args.port)
    except (FileNotFoundError, OSError) as exc:
        print(f"modelyard web: error: {exc}", file=sys.stderr)
        return 1
    server.warm()
    host, port = server.server_address[:2]
    print(f"serving {args.site} at http://{host}:{port}/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
