"""Files the sampling tests need, written from their definitions:
  files.py repeat-model PATH V MAXT   an llm.c checkpoint whose next token is always the last
  files.py random-model PATH V        an llm.c checkpoint of vocabulary V, small random weights
  files.py nan-model PATH V           random-model with a NaN in wte and an infinity in qkvw
  files.py huge-model PATH V          random-model whose final LayerNorm scales by 3e38: finite
                                      weights, logits that overflow
  files.py tokenizer PATH VERSION V EOT   llm.c's tokenizer file; token i is byte i with
                                          letters' case swapped
  files.py escape                     stdin's bytes as train.sample_every prints them
"""
import random
import struct
import sys


def checkpoint(path, V, maxT, L, NH, C, fill):
    sizes = [("wte", V * C), ("wpe", maxT * C), ("ln1w", L * C), ("ln1b", L * C),
             ("qkvw", L * 3 * C * C), ("qkvb", L * 3 * C), ("attprojw", L * C * C),
             ("attprojb", L * C), ("ln2w", L * C), ("ln2b", L * C), ("fcw", L * 4 * C * C),
             ("fcb", L * 4 * C), ("fcprojw", L * C * 4 * C), ("fcprojb", L * C),
             ("lnfw", C), ("lnfb", C)]
    header = [20240326, 3, maxT, V, L, NH, C, V] + [0] * 248
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        for name, n in sizes:
            f.write(struct.pack("<%df" % n, *fill(name, n, C)))


def repeat_fill(name, n, C):
    # identity embedding (C = V), blocks and positions adding nothing,
    # LayerNorms the identity: the final LayerNorm of e_t peaks at t
    if name == "wte":
        return [1.0 if i // C == i % C else 0.0 for i in range(n)]
    if name in ("ln1w", "ln2w", "lnfw"):
        return [1.0] * n
    return [0.0] * n


def random_fill(name, n, C):
    rng = random.Random(name)
    if name in ("ln1w", "ln2w", "lnfw"):
        return [1.0] * n
    return [rng.gauss(0.0, 0.02) for _ in range(n)]


def nan_fill(name, n, C):
    values = random_fill(name, n, C)
    if name == "wte":
        values[3] = float("nan")
    if name == "qkvw":
        values[10] = float("inf")
    return values


def huge_fill(name, n, C):
    if name == "lnfw":
        return [3e38] * n
    return random_fill(name, n, C)


def tokenizer(path, version, V, eot):
    with open(path, "wb") as f:
        f.write(struct.pack("<256I", 20240328, version, V, eot, *([0] * 252)))
        for i in range(V):
            f.write(bytes([1]) + bytes([i]).swapcase())


def escape(data):
    out = []
    for b in data:
        if b == 10:
            out.append("\\n")
        elif b == 9:
            out.append("\\t")
        elif b == 92:
            out.append("\\\\")
        elif 0x20 <= b < 0x7f:
            out.append(chr(b))
        else:
            out.append("\\x%02x" % b)
    return "".join(out)


cmd = sys.argv[1]
if cmd == "repeat-model":
    V, maxT = int(sys.argv[3]), int(sys.argv[4])
    checkpoint(sys.argv[2], V, maxT, 1, 1, V, repeat_fill)
elif cmd == "random-model":
    checkpoint(sys.argv[2], int(sys.argv[3]), 8, 1, 1, 8, random_fill)
elif cmd == "nan-model":
    checkpoint(sys.argv[2], int(sys.argv[3]), 8, 1, 1, 8, nan_fill)
elif cmd == "huge-model":
    checkpoint(sys.argv[2], int(sys.argv[3]), 8, 1, 1, 8, huge_fill)
elif cmd == "tokenizer":
    tokenizer(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
elif cmd == "escape":
    print(escape(sys.stdin.buffer.read()))
else:
    sys.exit("files.py: unknown command " + cmd)
