"""The benchmark's trial model: the digits MLP with its learning rate, width and dropout taken
from the running trial (modelyard.tuning.trial_params), trained by `modelyard train`."""
import tf_keras as keras

from modelyard.tuning import trial_params


def build_model():
    p = trial_params({"learning_rate": 0.003, "width": 64, "dropout": 0.1})
    model = keras.Sequential([
        keras.Input((28, 28), dtype="uint8", name="image"),
        keras.layers.Rescaling(1 / 255),
        keras.layers.Flatten(),
        keras.layers.Dense(int(p["width"]), activation="relu"),
        keras.layers.Dropout(float(p["dropout"])),
        keras.layers.Dense(10, activation="softmax", name="probabilities"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(float(p["learning_rate"])),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
