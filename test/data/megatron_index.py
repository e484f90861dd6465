#!/usr/bin/python3
"""Reference GPT sample-index build with numpy, written from the description in
docs/specs/megatron.md section 3 (not from Megatron's code). The [oracle]
tests compare mtnlg's C++ build with it.

  megatron_index.py build ARGS.json  -> JSON {doc_idx, sample_idx, shuffle_idx, epochs, separate}
      ARGS.json: {"sizes": [...], "begin": b, "end": e, "seq_length": S, "num_samples": n, "seed": s}
  megatron_index.py shuffle N SEED   -> JSON list: RandomState(SEED).shuffle(arange(N))
  megatron_index.py split "969,30,1" N -> JSON list of split bounds, Megatron-Core's rule
  megatron_index.py split_legacy "969,30,1" N -> the same by legacy Megatron's rule
  megatron_index.py stream ARGS.json -> JSON lines {sample, source, documents, tokens}: a
      single source's sample stream, as `mtnlg data samples --json` prints it.
      ARGS.json: {"sizes", "split", "part", "seq_length", "num_samples", "seed",
      "weighted", "range": [a, b]}; token p of document d is (131 d + p) % 50000.
  megatron_index.py blend W1,W2,... N   -> JSON {index, sample, per_source}: the greedy interleave
"""
import json
import re
import sys

import numpy as np


def build(sizes, begin, end, S, n, seed):
    sizes = np.asarray(sizes, dtype=np.int64)
    docs = np.arange(begin, end, dtype=np.int32)
    T = int(sizes[begin:end].sum())
    # 1. epochs: smallest E with E*T >= n*S + 1
    E = 1
    while E * T < n * S + 1:
        E += 1
    # 2. separate final epoch?
    separate = False
    if E > 1:
        sans_final = ((E - 1) * T - 1) // S
        from_final = n - sans_final
        per_epoch = (T - 1) // S
        separate = from_final < int(0.8 * per_epoch)
    rng = np.random.RandomState(seed)

    def tiled(epochs):
        d = np.tile(docs, epochs).astype(np.int32)
        rng.shuffle(d)
        return d

    # 3. doc_idx
    if separate:
        doc_idx = np.concatenate([tiled(E - 1), tiled(1)])
    else:
        doc_idx = tiled(E)
    # 4. sample_idx: each sample takes S+1 tokens, the next starts at its last token
    total = (E * T - 1) // S
    flat = np.concatenate([np.full(sizes[d], i, dtype=np.int64) for i, d in enumerate(doc_idx)])
    offs = np.concatenate([np.arange(sizes[d], dtype=np.int64) for d in doc_idx])
    starts = np.arange(total + 1, dtype=np.int64) * S  # token position of each row in the stream
    # The last row may fall past the stream (a trailing partial sample): clamp to the end.
    starts = np.minimum(starts, flat.size - 1)
    sample_idx = np.stack([flat[starts], offs[starts]], axis=1)
    # Row 0 is the start of the walk, position 0 of doc_idx, even when that document is
    # empty (its first token then lives in a later document).
    sample_idx[0] = (0, 0)
    # Megatron's walk puts a boundary that ends exactly at a document's last token into
    # that document (offset = its length - 1), never at offset 0 of the next one: same
    # position in the stream, so the table above is already the walk's answer.
    # 5. shuffle_idx
    first = ((E - 1) * T - 1) // S if separate else total
    dtype = np.uint32 if total < np.iinfo(np.uint32).max - 1 else np.int64
    a = np.arange(0, first, dtype=dtype)
    rng.shuffle(a)
    if first < total:
        b = np.arange(first, total, dtype=dtype)
        rng.shuffle(b)
        a = np.concatenate([a, b])
    return doc_idx, sample_idx, a, E, separate


def split_fractions(split):
    f = [float(x) for x in re.findall(r"[.0-9]+", split)]
    f += [0.0] * (3 - len(f))
    return [x / sum(f) for x in f]


def split_bounds(split, n):
    """Megatron-Core (late 2023 on): the bookends are the running sums of the normalized
    fractions, 0, f0, f0+f1, f0+f1+f2; part k is [round(b_k n), round(b_k+1 n))."""
    bookends = [0.0]
    for x in split_fractions(split):
        bookends.append(bookends[-1] + x)
    return [int(round(b * float(n))) for b in bookends]


def split_bounds_legacy(split, n):
    """Legacy Megatron / Megatron-DeepSpeed: round each part's size, take running sums,
    then shift every bound but the first so that the last one is n."""
    f = split_fractions(split)
    b = [0]
    for x in f:
        b.append(b[-1] + int(round(x * float(n))))
    diff = b[-1] - n
    return [b[0]] + [x - diff for x in b[1:]]


def token(d, p):
    return (131 * d + p) % 50000


def stream(a):
    """One source, one split part, samples a..b-1 in training order.
    Unweighted (Megatron's `--data-path PREFIX`): the GPT dataset is built for exactly the
    requested samples and read in its own order. Weighted (`--data-path 1.0 PREFIX`): the
    dataset is built for ceil(ceil(n * 1.0) * 1.005) samples and the blend of one source
    takes its samples 0, 1, 2, ... (the interleave never leaves source 0)."""
    sizes, S, n = a["sizes"], a["seq_length"], a["num_samples"]
    bounds = split_bounds(a["split"], len(sizes))
    begin, end = bounds[a["part"]], bounds[a["part"] + 1]
    n_build = int(np.ceil(np.ceil(n * 1.0) * 1.005)) if a["weighted"] else n
    doc_idx, sample_idx, shuffle_idx, _, _ = build(sizes, begin, end, S, n_build, a["seed"])
    for i in range(*a["range"]):
        j = int(shuffle_idx[i])
        (p0, o0), (p1, o1) = sample_idx[j], sample_idx[j + 1]
        docs = [int(d) for d in doc_idx[p0:p1 + 1]]
        toks = []
        for k, d in enumerate(docs):
            lo = o0 if k == 0 else 0
            hi = o1 + 1 if k == len(docs) - 1 else sizes[d]
            toks += [token(d, p) for p in range(lo, hi)]
        assert len(toks) == S + 1
        print(json.dumps({"sample": i, "source": 0, "documents": docs, "tokens": toks}))


def main():
    if sys.argv[1] == "build":
        with open(sys.argv[2]) as f:
            a = json.load(f)
        d, s, sh, E, sep = build(a["sizes"], a["begin"], a["end"], a["seq_length"], a["num_samples"], a["seed"])
        json.dump({"doc_idx": d.tolist(), "sample_idx": s.reshape(-1).tolist(), "shuffle_idx": sh.tolist(),
                   "epochs": E, "separate": bool(sep)}, sys.stdout)
    elif sys.argv[1] == "shuffle":
        x = np.arange(int(sys.argv[2]), dtype=np.int64)
        np.random.RandomState(int(sys.argv[3])).shuffle(x)
        json.dump(x.tolist(), sys.stdout)
    elif sys.argv[1] == "blend":
        w = np.asarray([float(x) for x in sys.argv[2].split(",")], dtype=np.float64)
        w = w / w.sum()
        n = int(sys.argv[3])
        counts = [0] * len(w)
        index, sample = [], []
        for i in range(n):
            err = [w[d] * max(i, 1) - counts[d] for d in range(len(w))]
            d = max(range(len(w)), key=lambda k: (err[k], -k))  # largest error, lowest index on ties
            index.append(d)
            sample.append(counts[d])
            counts[d] += 1
        per_source = [int(np.ceil(np.ceil(n * x) * 1.005)) for x in w]
        json.dump({"index": index, "sample": sample, "per_source": per_source}, sys.stdout)
    elif sys.argv[1] == "split":
        json.dump(split_bounds(sys.argv[2], int(sys.argv[3])), sys.stdout)
    elif sys.argv[1] == "split_legacy":
        json.dump(split_bounds_legacy(sys.argv[2], int(sys.argv[3])), sys.stdout)
    elif sys.argv[1] == "stream":
        with open(sys.argv[2]) as f:
            a = json.load(f)
        stream(a)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
