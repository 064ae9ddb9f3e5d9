"""A trial that reports through TensorBoard event files, as a Keras TensorBoard callback lays
them out (train/ and validation/ runs, tag epoch_accuracy, TF2 tensor scalars).

Written with TensorBoard's TF-free record writer so the trial starts fast. Accuracy peaks at
optimizer=sgd, momentum=0.9, lr=0.01.
"""
import argparse
import os
import time

from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

parser = argparse.ArgumentParser()
parser.add_argument("--optimizer", required=True)
parser.add_argument("--momentum", type=float, default=0.0)  # only given when optimizer=sgd
parser.add_argument("--lr", type=float, required=True)
args = parser.parse_args()

quality = {"adam": 0.8, "sgd": 0.7 + 0.3 * args.momentum}[args.optimizer] - abs(args.lr - 0.01) * 5


def writer(run: str) -> RecordWriter:
    directory = os.path.join(os.environ["AIP_TENSORBOARD_LOG_DIR"], run)
    os.makedirs(directory, exist_ok=True)
    w = RecordWriter(open(os.path.join(directory, f"events.out.tfevents.{time.time():.0f}.trial"), "wb"))
    w.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
    return w


def scalar(tag: str, value: float, step: int) -> bytes:
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[value])
    meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, tensor=tensor, metadata=meta)])
    return event_pb2.Event(wall_time=time.time(), step=step, summary=summary).SerializeToString()


train, validation = writer("train"), writer("validation")
for epoch in range(3):
    # Training accuracy is higher and the wrong thing to tune on: the validation run must win.
    train.write(scalar("epoch_accuracy", min(1.0, quality + 0.2), epoch))
    validation.write(scalar("epoch_accuracy", quality * (epoch + 1) / 3, epoch))
    train.flush()
    validation.flush()
train.close()
validation.close()
