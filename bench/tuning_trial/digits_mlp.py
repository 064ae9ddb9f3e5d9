"""The benchmark's trial model: the digits MLP with its learning rate, width and dropout taken
from the running trial (modelyard.tuning.trial_params), trained by `modelyard train`.

``build`` is the same network for the in-process peers (bench/tuning_trial/peers.py): it takes the
Keras module to build with, since KerasTuner drives Keras 3 while `modelyard train` uses tf_keras.
"""
from types import ModuleType


def build(keras: ModuleType, learning_rate: float, width: int, dropout: float):
    model = keras.Sequential([
        keras.Input((28, 28), dtype="uint8", name="image"),
        keras.layers.Rescaling(1 / 255),
        keras.layers.Flatten(),
        keras.layers.Dense(int(width), activation="relu"),
        keras.layers.Dropout(float(dropout)),
        keras.layers.Dense(10, activation="softmax", name="probabilities"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(float(learning_rate)),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def build_model():
    import tf_keras

    from modelyard.tuning import trial_params

    p = trial_params({"learning_rate": 0.003, "width": 64, "dropout": 0.1})
    return build(tf_keras, p["learning_rate"], p["width"], p["dropout"])
