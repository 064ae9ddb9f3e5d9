"""The demo model: an MLP on 28x28 uint8 digit images, the model the README walks through.

It takes raw uint8 pixels (scaling is inside the model), so the exported version
answers the same requests TF Serving's MNIST examples send.
"""
from __future__ import annotations


def build_model(learning_rate: float = 0.01, hidden: int = 100):
    """A compiled tf_keras MLP: uint8 [28, 28] -> 10 class probabilities."""
    import tf_keras as keras

    model = keras.Sequential(
        [
            keras.Input(shape=(28, 28), dtype="uint8", name="image"),
            keras.layers.Rescaling(1.0 / 255),
            keras.layers.Flatten(),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=learning_rate, momentum=0.9),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model
