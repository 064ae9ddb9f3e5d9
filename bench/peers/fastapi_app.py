"""A FastAPI + TensorFlow prediction app, written the way a user would write it by hand.

    MODEL_DIR=models/my_mnist_model/0002 RUNTIME=tensorflow uvicorn fastapi_app:app --port 8080

Speaks TF Serving's REST predict protocol (``{"instances": [...]}`` in,
``{"predictions": [...]}`` out) so the same load generator drives every server.
RUNTIME=litert converts the SavedModel to TFLite at start-up and runs that instead.
"""
import os

import numpy as np
import tensorflow as tf
from fastapi import FastAPI, Request

MODEL_DIR = os.environ["MODEL_DIR"]
RUNTIME = os.environ.get("RUNTIME", "tensorflow")
INPUT = os.environ.get("INPUT_NAME", "image")
OUTPUT = os.environ.get("OUTPUT_NAME", "probabilities")

app = FastAPI()

if RUNTIME == "litert":
    from ai_edge_litert.interpreter import Interpreter

    tflite_model = tf.lite.TFLiteConverter.from_saved_model(MODEL_DIR).convert()
    interpreter = Interpreter(model_content=tflite_model)
    runner = interpreter.get_signature_runner("serving_default")

    def predict_batch(x: np.ndarray) -> np.ndarray:
        return runner(**{INPUT: x})[OUTPUT]
else:
    model = tf.saved_model.load(MODEL_DIR)
    infer = model.signatures["serving_default"]
    dtype = infer.structured_input_signature[1][INPUT].dtype

    def predict_batch(x: np.ndarray) -> np.ndarray:
        return infer(**{INPUT: tf.constant(x, dtype=dtype)})[OUTPUT].numpy()


@app.get("/v1/models/{name}")
async def status(name: str):
    return {"model_version_status": [{"state": "AVAILABLE"}]}


@app.post("/v1/models/{name}:predict")
async def predict(name: str, request: Request):
    body = await request.json()
    x = np.asarray(body["instances"], dtype=np.uint8)
    y = predict_batch(x)
    return {"predictions": y.tolist()}
