"""A KServe Python model server for a SavedModel, written the way a user would write it.

    python kserve_model.py --model_name my_mnist_model --model_dir models/my_mnist_model/0002 \
        --runtime tensorflow --http_port 8080 --grpc_port 8081

KServe's V1 protocol (``POST /v1/models/<name>:predict`` with ``{"instances": [...]}``)
is TF Serving's. ``--runtime litert`` converts the SavedModel to TFLite at load time.
"""
import argparse

import kserve
import numpy as np
import tensorflow as tf


class SavedModelPredictor(kserve.Model):
    def __init__(self, name: str, model_dir: str, runtime: str, input_name: str, output_name: str):
        super().__init__(name)
        self.model_dir = model_dir
        self.runtime = runtime
        self.input_name = input_name
        self.output_name = output_name
        self.load()

    def load(self) -> bool:
        if self.runtime == "litert":
            from ai_edge_litert.interpreter import Interpreter

            tflite_model = tf.lite.TFLiteConverter.from_saved_model(self.model_dir).convert()
            self.interpreter = Interpreter(model_content=tflite_model)
            runner = self.interpreter.get_signature_runner("serving_default")
            self._call = lambda x: runner(**{self.input_name: x})[self.output_name]
        else:
            model = tf.saved_model.load(self.model_dir)
            infer = model.signatures["serving_default"]
            dtype = infer.structured_input_signature[1][self.input_name].dtype
            self._model = model
            self._call = lambda x: infer(**{self.input_name: tf.constant(x, dtype=dtype)})[self.output_name].numpy()
        self.ready = True
        return self.ready

    def predict(self, payload: dict, headers: dict = None) -> dict:
        x = np.asarray(payload["instances"], dtype=np.uint8)
        return {"predictions": self._call(x).tolist()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(parents=[kserve.model_server.parser])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--runtime", choices=("tensorflow", "litert"), default="tensorflow")
    parser.add_argument("--input_name", default="image")
    parser.add_argument("--output_name", default="probabilities")
    args, _ = parser.parse_known_args()
    model = SavedModelPredictor(args.model_name, args.model_dir, args.runtime, args.input_name, args.output_name)
    kserve.ModelServer().start([model])
