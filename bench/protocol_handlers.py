"""CPU per request of each API's handler, in process, without sockets (issue 30's two misses).

    python3 bench/protocol_handlers.py              # 15 rounds of 500 calls per handler
    python3 bench/protocol_handlers.py --rounds 30

``bench/serving.py --v2`` measures V2 against TF Serving's API end to end, where the HTTP and
gRPC transports (the same for both) add to each side and the 2-core machine's load moves every
figure. This measures only what differs: a ``modelyard serve``'s own handler for each API, called
in this process with the bytes a client sends, on the demo digits model (uint8 [1, 28, 28]) on
LiteRT. TF Serving REST ``:predict`` and V2 REST JSON ``/infer`` (``RestApp.handle``,
``V2RestApp.handle``), TF Serving gRPC ``Predict`` and V2 gRPC ``ModelInfer`` (request parsed,
handler, response serialized: what ``grpc_api.Services`` runs for either gRPC server). The sides
take turns round by round; CPU time (``time.process_time``), so other work on the machine moves
the figures less than it moves wall time. The table gives each handler's median µs per call and
V2's ratio to the TF Serving API it sits beside.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from harness import command_line, log, machine, markdown_table, take_turns, write_results  # noqa: E402


def _handlers() -> dict[str, callable]:
    import tensorflow as tf
    from tensorflow_serving.apis.predict_pb2 import PredictRequest
    from tritonclient.grpc import service_pb2

    from modelyard.demo import demo_instances, demo_predict_body, ensure_demo_model
    from modelyard.serving.options import add_flags, resolve
    from modelyard.serving.protocol.grpc_api import Services
    from modelyard.serving.protocol.rest import RestApp
    from modelyard.serving.server import ModelServer, settle_heap_for_serving

    base = ensure_demo_model(log=log)
    parser = argparse.ArgumentParser()
    add_flags(parser)
    args = parser.parse_args(["--model_name", "digits", "--model_base_path", str(base), "--runtime", "litert",
                              "--rest_api_port", "0"])
    server = ModelServer(resolve(args, {}))
    server.apply_configs(server.initial_configs(), wait_s=None)
    rest = RestApp(server.core, threads=2)
    services = Services(server.core, lambda *_: None)
    digit = demo_instances(1)
    tfs_body = demo_predict_body(1).encode()
    v2_body = json.dumps({"inputs": [{"name": "image", "shape": [1, 28, 28], "datatype": "UINT8",
                                      "data": digit.ravel().tolist()}]}, separators=(",", ":")).encode()
    predict = PredictRequest()
    predict.model_spec.name = "digits"
    predict.inputs["image"].CopyFrom(tf.make_tensor_proto(digit))
    predict_bytes = predict.SerializeToString()
    infer = service_pb2.ModelInferRequest(model_name="digits")
    infer.inputs.add(name="image", datatype="UINT8", shape=[1, 28, 28])
    infer.raw_input_contents.append(digit.tobytes())
    infer_bytes = infer.SerializeToString()

    def grpc_call(path: str, body: bytes):
        method = services.methods[path]
        response, code, message = method[2](method[1].FromString(body))
        assert response is not None, (path, code, message)
        return response if isinstance(response, (bytes, bytearray)) else response.SerializeToString()

    handlers = {
        "TF Serving REST :predict": lambda: rest.handle("POST", "/v1/models/digits:predict", tfs_body),
        "V2 REST JSON /infer": lambda: rest.v2.handle("POST", "/v2/models/digits/infer", v2_body),
        "TF Serving gRPC Predict": lambda: grpc_call("/tensorflow.serving.PredictionService/Predict", predict_bytes),
        "V2 gRPC ModelInfer": lambda: grpc_call("/inference.GRPCInferenceService/ModelInfer", infer_bytes),
    }
    for name, call in handlers.items():  # every side answers, and warms up
        for _ in range(200):
            call()
    assert rest.handle("POST", "/v1/models/digits:predict", tfs_body)[0] == 200
    assert rest.v2.handle("POST", "/v2/models/digits/infer", v2_body)[0] == 200
    settle_heap_for_serving()
    return handlers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=500, help="calls per handler per round")
    parser.add_argument("--out", help="results directory (default bench/results)")
    args = parser.parse_args()
    started = machine()
    handlers = _handlers()
    def run(name: str, _round: int) -> dict:
        call = handlers[name]
        t0 = time.process_time()
        for _ in range(args.calls):
            call()
        return {"us": (time.process_time() - t0) / args.calls * 1e6}

    results = take_turns(list(handlers), args.rounds, run,
                         report=lambda name, r, res: log(f"round {r + 1}/{args.rounds} {name}: {res['us']:.0f} µs"))
    per_call = {name: [r["us"] for r in runs] for name, runs in results.items()}
    med = {name: statistics.median(values) for name, values in per_call.items()}
    pairs = {"V2 REST JSON /infer": "TF Serving REST :predict", "V2 gRPC ModelInfer": "TF Serving gRPC Predict"}
    rows = [[name, f"{med[name]:.1f}", f"{min(per_call[name]):.1f}",
             f"{med[name] / med[pairs[name]]:.2f}x" if name in pairs else ""] for name in handlers]
    text = (f"# Each API's handler, CPU per call, in process (issue 30)\n\n{started}\n\n`{command_line()}`\n\n"
            f"The demo digits model (uint8 [1, 28, 28]) on LiteRT; {args.rounds} rounds of {args.calls} calls per "
            "handler, taking turns (order reversed every round); CPU time per call, median and best round. "
            "No sockets: the transports are the same for both APIs and are not in these figures.\n\n"
            + markdown_table(["handler", "µs per call (median)", "best round", "V2 / TF Serving API"], rows,
                             align="lrrr") + "\n")
    write_results("protocol_handlers", text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
