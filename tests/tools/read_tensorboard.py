#!/usr/bin/env python3
"""Reads a folder of TensorBoard event files with TensorBoard's own code, for the C++ tests.

Usage: read_tensorboard.py DIR
       read_tensorboard.py --as-metrics DIR

Prints one JSON object:
    {"scalars": {TAG: [[STEP, VALUE], ...]}, "texts": {TAG: [[STEP, "TEXT"], ...]}}
with the points of each tag in the order TensorBoard holds them (step order for one run).
With --as-metrics, prints instead the scalars "<kind>/<field>" of a ptrain run back as metrics.jsonl
rows ({"kind", "step", field: value, ...}, one per kind and step), so that `ptrain plot` draws what
TensorBoard holds (docs/monitoring.md).

Two passes, both TensorBoard's:
  1. every event file of DIR through TensorBoard's record iterator, which checks the length and both
     CRCs of each record, and each record parsed as an Event; the first must be the file_version
     event. TensorBoard's own loading stops quietly at a bad record (it takes it for a file still being
     written), so this pass is what makes a damaged file an error here.
  2. the folder through EventAccumulator, as TensorBoard's dashboards read it: all files of the folder
     as one run, nothing sampled away (size_guidance 0 for every kind). Text summaries come back as
     tensors of the text plugin; their string_val is decoded as UTF-8.
Exits 1 with a message on stderr naming the file on anything it cannot read, and on any warning
TensorBoard logs while reading.
"""

import json
import logging
import os
import sys

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.compat.proto import event_pb2


def fail(message):
    print("read_tensorboard: " + message, file=sys.stderr)
    sys.exit(1)


class _FailOnWarning(logging.Handler):
    """TensorBoard logs (and carries on past) what it cannot make sense of; a test must not."""

    def emit(self, record):
        fail("tensorboard logged %s: %s" % (record.levelname, record.getMessage()))


def check_file(path):
    """Reads every record of one event file strictly; returns how many events it holds."""
    try:
        records = list(event_file_loader._make_tf_record_iterator(path))
    except Exception as e:  # DataLossError (a CRC or a truncated record), OSError
        fail("%s: %s: %s" % (path, type(e).__name__, e))
    if not records:
        fail("%s: no records" % path)
    for index, record in enumerate(records):
        try:
            event = event_pb2.Event.FromString(record)
        except Exception as e:  # google.protobuf.message.DecodeError
            fail("%s: record %d is not an Event: %s" % (path, index, e))
        if index == 0 and event.file_version != "brain.Event:2":
            fail("%s: the first event is not file_version brain.Event:2 but %r" % (path, event))
    return len(records)


def main():
    args = sys.argv[1:]
    as_metrics = args[:1] == ["--as-metrics"]
    if as_metrics:
        args = args[1:]
    if len(args) != 1:
        fail("usage: read_tensorboard.py [--as-metrics] DIR")
    folder = args[0]
    if not os.path.isdir(folder):
        fail("%s: not a folder" % folder)
    logging.getLogger("tensorboard").addHandler(_FailOnWarning(level=logging.WARNING))

    files = sorted(name for name in os.listdir(folder) if "tfevents" in name)
    if not files:
        fail("%s: no event files (names containing 'tfevents')" % folder)
    for name in files:
        check_file(os.path.join(folder, name))

    accumulator = event_accumulator.EventAccumulator(
        folder, size_guidance=event_accumulator.STORE_EVERYTHING_SIZE_GUIDANCE
    )
    accumulator.Reload()
    tags = accumulator.Tags()

    scalars = {}
    for tag in tags[event_accumulator.SCALARS]:
        scalars[tag] = [[e.step, e.value] for e in accumulator.Scalars(tag)]

    texts = {}
    for tag in tags[event_accumulator.TENSORS]:
        if accumulator.SummaryMetadata(tag).plugin_data.plugin_name != "text":
            continue
        points = []
        for e in accumulator.Tensors(tag):
            proto = e.tensor_proto
            if len(proto.string_val) != 1 or proto.tensor_shape.dim:
                fail("%s: text %r at step %d is not a scalar string tensor" % (folder, tag, e.step))
            try:
                points.append([e.step, proto.string_val[0].decode("utf-8")])
            except UnicodeDecodeError as error:
                fail("%s: text %r at step %d is not UTF-8: %s" % (folder, tag, e.step, error))
        texts[tag] = points

    if as_metrics:
        rows = {}
        for tag, points in scalars.items():
            kind, _, field = tag.partition("/")
            if not field or field.rsplit("/", 1)[-1].startswith("rank"):
                continue  # per-rank lists are not curves
            for step, value in points:
                rows.setdefault((kind, step), {"kind": kind, "step": step})[field] = value
        for key in sorted(rows):
            print(json.dumps(rows[key], sort_keys=True))
        return
    print(json.dumps({"scalars": scalars, "texts": texts}, sort_keys=True))


if __name__ == "__main__":
    main()
