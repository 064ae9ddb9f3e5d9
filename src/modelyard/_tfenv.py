"""Environment defaults that must be in place before TensorFlow is first imported.

tf_keras is the Keras used for training (Keras 3 lacks ParameterServerStrategy), so
TF_USE_LEGACY_KERAS=1 makes ``tf.keras`` resolve to it. TensorFlow's C++ logs are
quieted unless the user already chose a level.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
