#!/usr/bin/python3
"""Independent reader/writer of Megatron's MMap indexed dataset (.bin/.idx, version 1),
written from the layout in docs/specs/megatron.md section 2 with numpy only.
Used by the [oracle] tests to cross-check mtnlg's reader and writer.

  megatron_idx.py dump PREFIX          -> JSON on stdout: dtype code, sequence lengths,
                                          pointers, document indices, tokens per sequence
  megatron_idx.py write PREFIX DOCS.json DTYPE_CODE
                                       -> writes PREFIX.bin/.idx; DOCS.json is a list of
                                          documents, each a list of sequences (lists of ids)
"""
import json
import struct
import sys

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
          8: np.uint16}


def read(prefix):
    with open(prefix + ".idx", "rb") as f:
        buf = f.read()
    assert buf[:9] == MAGIC, "bad magic"
    (version,) = struct.unpack_from("<Q", buf, 9)
    assert version == 1, version
    code = buf[17]
    n, d = struct.unpack_from("<QQ", buf, 18)
    off = 34
    lengths = np.frombuffer(buf, dtype="<i4", count=n, offset=off)
    off += 4 * n
    pointers = np.frombuffer(buf, dtype="<i8", count=n, offset=off)
    off += 8 * n
    doc_idx = np.frombuffer(buf, dtype="<i8", count=d, offset=off)
    off += 8 * d
    assert off == len(buf), (off, len(buf))
    assert doc_idx[-1] == n
    dt = np.dtype(DTYPES[code]).newbyteorder("<")
    data = np.fromfile(prefix + ".bin", dtype=dt)
    item = dt.itemsize
    assert data.size * item == (int(pointers[-1]) + int(lengths[-1]) * item if n else 0)
    seqs = [data[p // item: p // item + l].tolist() for p, l in zip(pointers.tolist(), lengths.tolist())]
    return code, lengths.tolist(), pointers.tolist(), doc_idx.tolist(), seqs


def write(prefix, docs, code):
    dt = np.dtype(DTYPES[code]).newbyteorder("<")
    lengths, doc_idx = [], [0]
    with open(prefix + ".bin", "wb") as f:
        for doc in docs:
            for seq in doc:
                f.write(np.asarray(seq, dtype=dt).tobytes())
                lengths.append(len(seq))
            doc_idx.append(len(lengths))
    lengths = np.asarray(lengths, dtype="<i4")
    pointers = np.zeros(len(lengths), dtype="<i8")
    if len(lengths) > 1:
        pointers[1:] = np.cumsum(lengths[:-1].astype(np.int64)) * dt.itemsize
    with open(prefix + ".idx", "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())
        f.write(np.asarray(doc_idx, dtype="<i8").tobytes())


def main():
    if sys.argv[1] == "dump":
        code, lengths, pointers, doc_idx, seqs = read(sys.argv[2])
        json.dump({"dtype": code, "lengths": lengths, "pointers": pointers, "doc_idx": doc_idx, "tokens": seqs},
                  sys.stdout)
    elif sys.argv[1] == "write":
        with open(sys.argv[3]) as f:
            docs = json.load(f)
        write(sys.argv[2], docs, int(sys.argv[4]))
    else:
        sys.exit("usage: megatron_idx.py dump PREFIX | write PREFIX DOCS.json DTYPE_CODE")


if __name__ == "__main__":
    main()
