"""A KServe Python model server speaking the Open Inference Protocol (V2) for a LiteRT model,
written the way a user would write it with ``kserve`` 0.21:

    python kserve_v2_model.py --model_name my_mnist_model --tflite model.tflite --http_port 8080 --grpc_port 8081

``POST /v2/models/<name>/infer`` reaches ``predict`` with an ``InferRequest``; the answer is an
``InferResponse`` with the model's first output as JSON data.
"""
import argparse
import uuid

import kserve
from kserve import InferOutput, InferRequest, InferResponse


class LiteRTModel(kserve.Model):
    def __init__(self, name: str, tflite: str):
        super().__init__(name)
        self.tflite = tflite
        self.load()

    def load(self) -> bool:
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(model_path=self.tflite)
        self.runner = interpreter.get_signature_runner("serving_default")
        self.input_name = next(iter(self.runner.get_input_details()))
        self.output_name = next(iter(self.runner.get_output_details()))
        self.ready = True
        return self.ready

    def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        x = payload.inputs[0].as_numpy()
        y = self.runner(**{self.input_name: x})[self.output_name]
        out = InferOutput(name=self.output_name, shape=list(y.shape), datatype="FP32")
        out.set_data_from_numpy(y, binary_data=False)
        # A request without an id gets one (KServe's own examples do the same).
        return InferResponse(response_id=payload.id or str(uuid.uuid4()), model_name=self.name, infer_outputs=[out])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(parents=[kserve.model_server.parser])
    parser.add_argument("--tflite", required=True)
    args, _ = parser.parse_known_args()
    kserve.ModelServer().start([LiteRTModel(args.model_name, args.tflite)])
