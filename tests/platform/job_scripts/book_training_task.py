"""The textbook's Vertex AI training script (Hands-On Machine Learning, 3rd ed., chapter 19: the
``my_vertex_ai_training_task.py`` cell), as a Vertex AI user writes it: MultiWorkerMirroredStrategy,
the chief writing TensorBoard logs, checkpoints and the final model to the ``gs://`` directories Vertex
gives it (``AIP_*``) through TensorFlow itself, the other workers to temporary directories.

The changes from the book: its data (Fashion MNIST, downloaded) is scikit-learn's digits, which need
no network; two epochs instead of ten; the other workers' temporary paths are strings (tf_keras 2.21's
ModelCheckpoint calls ``filepath.endswith``, which a ``Path`` lacks).
"""
import os
import tempfile
from pathlib import Path

import tensorflow as tf
from sklearn.datasets import load_digits

strategy = tf.distribute.MultiWorkerMirroredStrategy()
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
print(f"Starting task {resolver.task_type} #{resolver.task_id}")

if resolver.task_type == "chief":
    model_dir = os.getenv("AIP_MODEL_DIR")  # paths provided by Vertex AI
    tensorboard_log_dir = os.getenv("AIP_TENSORBOARD_LOG_DIR")
    checkpoint_dir = os.getenv("AIP_CHECKPOINT_DIR")
else:
    tmp_dir = Path(tempfile.mkdtemp())  # other workers use temporary dirs
    model_dir = str(tmp_dir / "model")
    tensorboard_log_dir = str(tmp_dir / "logs")
    checkpoint_dir = str(tmp_dir / "ckpt")

callbacks = [tf.keras.callbacks.TensorBoard(tensorboard_log_dir),
             tf.keras.callbacks.ModelCheckpoint(checkpoint_dir)]

digits = load_digits()
X = (digits.images / 16.0).astype("float32")
y = digits.target
X_train, y_train, X_valid, y_valid = X[:1500], y[:1500], X[1500:], y[1500:]

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Flatten(input_shape=[8, 8]),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(loss="sparse_categorical_crossentropy", optimizer="adam", metrics=["accuracy"])

model.fit(X_train, y_train, validation_data=(X_valid, y_valid), epochs=2, callbacks=callbacks)
model.save(model_dir, save_format="tf")
