#!/usr/bin/python3
"""Outside oracle for mtnlg's TensorBoard writer (core/tensorboard.cpp).

Reads tfevents files WITHOUT TensorFlow: checks the TFRecord framing and both masked
CRC32C values of every record (CRC computed here bit by bit, independently of the C++
table), then parses each record with Debian's python3-protobuf, using Event/Summary
message classes built at runtime from descriptors declared below (the same field
numbers as tensorflow/core/util/event.proto and framework/summary.proto).

Output, one line per item, tab-separated:
    version <file_version>
    scalar  <step> <tag> <value>         (value: repr of the float32 read back)
and, if the `tensorboard` package is importable, the same scalars as TensorBoard's own
EventAccumulator sees them:
    tb_scalar <step> <tag> <value>
otherwise one line "tensorboard: not importable, skipped".

Usage: read_tfevents.py FILE_OR_DIR...   Exit 0 ok, 1 corrupt file, 2 usage.
"""
import os
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory


def crc32c(data: bytes) -> int:
    # Bitwise (no table) reflected Castagnoli CRC: slow but obviously the definition.
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def build_event_class():
    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="mtnlg_oracle_event.proto", package="oracle", syntax="proto3")

    def add_msg(name, fields):
        m = fd.message_type.add(name=name)
        for fname, num, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=num, type=ftype, label=label)
            if type_name:
                f.type_name = type_name

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    add_msg("Value", [("tag", 1, F.TYPE_STRING, opt, None), ("simple_value", 2, F.TYPE_FLOAT, opt, None)])
    add_msg("Summary", [("value", 1, F.TYPE_MESSAGE, rep, ".oracle.Value")])
    add_msg("Event", [
        ("wall_time", 1, F.TYPE_DOUBLE, opt, None),
        ("step", 2, F.TYPE_INT64, opt, None),
        ("file_version", 3, F.TYPE_STRING, opt, None),
        ("summary", 5, F.TYPE_MESSAGE, opt, ".oracle.Summary"),
    ])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    desc = pool.FindMessageTypeByName("oracle.Event")
    if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.22
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)


def read_records(path):
    with open(path, "rb") as f:
        buf = f.read()
    pos, n = 0, 0
    while pos < len(buf):
        if len(buf) - pos < 12:
            raise ValueError(f"{path}: record {n}: truncated header at byte {pos}")
        header = buf[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (len_crc,) = struct.unpack("<I", buf[pos + 8:pos + 12])
        if masked(crc32c(header)) != len_crc:
            raise ValueError(f"{path}: record {n}: length CRC mismatch at byte {pos}")
        start = pos + 12
        if start + length + 4 > len(buf):
            raise ValueError(f"{path}: record {n}: truncated data at byte {start}")
        data = buf[start:start + length]
        (data_crc,) = struct.unpack("<I", buf[start + length:start + length + 4])
        if masked(crc32c(data)) != data_crc:
            raise ValueError(f"{path}: record {n}: data CRC mismatch at byte {start}")
        yield data
        pos = start + length + 4
        n += 1


def event_files(args):
    for a in args:
        if os.path.isdir(a):
            for name in sorted(os.listdir(a)):
                if name.startswith("events.out.tfevents."):
                    yield os.path.join(a, name)
        else:
            yield a


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    Event = build_event_class()
    files = list(event_files(argv[1:]))
    if not files:
        print("read_tfevents: no event files found", file=sys.stderr)
        return 2
    try:
        for path in files:
            for i, data in enumerate(read_records(path)):
                ev = Event()
                ev.ParseFromString(data)
                if ev.file_version:
                    if i != 0:
                        raise ValueError(f"{path}: record {i}: file_version after the first record")
                    print(f"version\t{ev.file_version}")
                elif i == 0:
                    raise ValueError(f"{path}: first record has no file_version")
                if ev.wall_time <= 0:
                    raise ValueError(f"{path}: record {i}: wall_time {ev.wall_time} is not a time")
                for v in ev.summary.value:
                    print(f"scalar\t{ev.step}\t{v.tag}\t{v.simple_value!r}")
    except ValueError as e:
        print(f"read_tfevents: {e}", file=sys.stderr)
        return 1

    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError:
        print("tensorboard: not importable, skipped")
        return 0
    for path in files:
        acc = event_accumulator.EventAccumulator(path, size_guidance={event_accumulator.SCALARS: 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            for s in acc.Scalars(tag):
                print(f"tb_scalar\t{s.step}\t{tag}\t{s.value!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
