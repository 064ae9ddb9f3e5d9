"""A real `modelyard train` model whose extra metric `objective` is a known function of the
trial's hyperparameters (read with modelyard.tuning.trial_params): its optimum is shift=0.5."""
import tensorflow as tf
import tf_keras as keras

from modelyard.tuning import trial_params


def build_model():
    params = trial_params({"shift": 0.0, "width": 16})
    target = 1.0 - (params["shift"] - 0.5) ** 2

    def objective(y_true, y_pred):
        return tf.reduce_mean(y_pred, axis=-1) * 0.0 + target

    model = keras.Sequential([
        keras.Input((28, 28), dtype="uint8", name="image"),
        keras.layers.Rescaling(1 / 255),
        keras.layers.Flatten(),
        keras.layers.Dense(int(params["width"]), activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy", objective])
    return model
