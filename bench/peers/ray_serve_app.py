"""The Ray Serve peer: the digits model as a Ray Serve deployment, written the way a user would.

    python ray_serve_app.py --address HOST:PORT --http-port 8000 --model-dir models/my_mnist_model/0001

Deploys one application on the running Ray cluster at ``--address`` (its HTTP proxy on
``--http-port``) and returns once it answers; the application keeps running after this driver
exits (Serve's controller is detached) until the cluster stops. It speaks TF Serving's REST predict
protocol (``{"instances": [...]}`` in, ``{"predictions": [...]}`` out, via a FastAPI ingress) so the
same load generator drives it. Like the FastAPI peer it runs the SavedModel with TensorFlow
(--runtime tensorflow) or, by default, converted to TFLite at start-up (--runtime litert: what
`modelyard serve` picks for this model).
(No `from __future__ import annotations` here: FastAPI must see the real `Request` type.)
One replica, autoscaling off, so that one replica is compared with one replica; Serve's defaults
otherwise, except --max-ongoing-requests (Serve's default is 5 per replica: past it the proxy
queues requests and backs off, and at 32 connections its throughput falls below that at 4).
"""

import argparse
import json
import time
import urllib.request

import numpy as np
from fastapi import FastAPI, Request
from ray import serve

INPUT, OUTPUT = "image", "probabilities"
api = FastAPI()


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 1})
@serve.ingress(api)
class Digits:
    def __init__(self, model_dir: str, runtime: str) -> None:
        import tensorflow as tf

        if runtime == "litert":
            from ai_edge_litert.interpreter import Interpreter

            interpreter = Interpreter(model_content=tf.lite.TFLiteConverter.from_saved_model(model_dir).convert())
            runner = interpreter.get_signature_runner("serving_default")
            self.predict_batch = lambda x: runner(**{INPUT: x})[OUTPUT]
        else:
            infer = tf.saved_model.load(model_dir).signatures["serving_default"]
            dtype = infer.structured_input_signature[1][INPUT].dtype
            self.predict_batch = lambda x: infer(**{INPUT: tf.constant(x, dtype=dtype)})[OUTPUT].numpy()

    @api.get("/v1/models/{name}")
    async def status(self, name: str) -> dict:
        return {"model_version_status": [{"state": "AVAILABLE"}]}

    @api.post("/v1/models/{name}:predict")
    async def predict(self, name: str, request: Request) -> dict:
        body = await request.json()
        return {"predictions": self.predict_batch(np.asarray(body["instances"], dtype=np.uint8)).tolist()}


def main() -> None:
    import ray

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--address", required=True)
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--runtime", choices=["tensorflow", "litert"], default="litert")
    ap.add_argument("--max-ongoing-requests", type=int, default=5, help="per replica (Serve's default: 5)")
    args = ap.parse_args()
    ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.http_port})
    app = Digits.options(max_ongoing_requests=args.max_ongoing_requests).bind(args.model_dir, args.runtime)
    serve.run(app, name="digits", route_prefix="/")
    url = f"http://127.0.0.1:{args.http_port}/v1/models/model"
    deadline = time.monotonic() + 300
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                print(json.loads(resp.read()))
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


if __name__ == "__main__":
    main()
