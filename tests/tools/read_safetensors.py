#!/usr/bin/env python3
"""Independent safetensors reader used by the C++ tests.

Follows the published format (an 8-byte little-endian header length N, N bytes
of JSON header, then the data) with nothing but the standard library and torch,
so a file that ptrain writes is checked by code that shares nothing with
ptrain's own reader.

Usage: read_safetensors.py FILE

Prints one line per tensor, in ascending name order, tab-separated:
    tensor  NAME  DTYPE  SHAPE  SUM  WEIGHTED
where SHAPE is the dims joined by ',' ('' for a 0-dim tensor), SUM is the sum
of the elements as float64 and WEIGHTED the sum of element[i] * (i + 1) over
the flattened tensor (it changes when elements are permuted); both are
printed with repr() so they round-trip exactly. Then one line per metadata
entry:
    meta  KEY  VALUE
Exits 1 with a message on stderr when the file breaks the format.
"""

import json
import struct
import sys

import torch

DTYPES = {
    "F64": (torch.float64, 8),
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
    "I16": (torch.int16, 2),
    "I8": (torch.int8, 1),
    "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1),
}


def fail(msg):
    sys.stderr.write("read_safetensors: " + msg + "\n")
    sys.exit(1)


def main():
    if len(sys.argv) != 2:
        fail("usage: read_safetensors.py FILE")
    with open(sys.argv[1], "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        fail("file shorter than 8 bytes")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        fail("header length %d past the end of the file" % n)
    header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    data = blob[8 + n :]
    metadata = header.pop("__metadata__", {})

    spans = []
    lines = []
    for name in sorted(header):
        entry = header[name]
        dtype, size = DTYPES[entry["dtype"]]
        shape = list(entry["shape"])
        begin, end = entry["data_offsets"]
        numel = 1
        for d in shape:
            numel *= d
        if end - begin != numel * size or end > len(data):
            fail("tensor %s: data_offsets %r do not fit shape %r" % (name, [begin, end], shape))
        spans.append((begin, end))
        if numel == 0:
            t = torch.empty(shape, dtype=dtype)
        else:
            # bytearray: frombuffer wants a writable buffer; the copy keeps the
            # tensor independent of `blob`.
            t = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype).reshape(shape)
        flat = t.reshape(-1).to(torch.float64)
        weights = torch.arange(1, flat.numel() + 1, dtype=torch.float64)
        total = float(flat.sum())
        weighted = float((flat * weights).sum())
        lines.append(
            "\t".join(
                ["tensor", name, entry["dtype"], ",".join(str(d) for d in shape), repr(total), repr(weighted)]
            )
        )

    # The spans must tile the data section exactly.
    cursor = 0
    for begin, end in sorted(spans):
        if begin != cursor:
            fail("data section not tiled exactly at byte %d" % cursor)
        cursor = end
    if cursor != len(data):
        fail("%d trailing data bytes" % (len(data) - cursor))

    for key in sorted(metadata):
        lines.append("\t".join(["meta", key, metadata[key]]))
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
