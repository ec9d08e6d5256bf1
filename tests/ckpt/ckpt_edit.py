#!/usr/bin/env python3
"""Damage loom checkpoint files (format 4) on purpose, for ckpt_test.sh.

  ckpt_edit.py set FILE FIELD VALUE [--reseal]   a named header field
  ckpt_edit.py table FILE UNIT BEGIN [COUNT] [--reseal]  every slice of one unit in meta.loom's shard table
  ckpt_edit.py record FILE FIELD VALUE [--reseal] the first record of a shard file
  ckpt_edit.py poke FILE OFFSET HEX [--reseal]   raw bytes (OFFSET < 0: from the end)
  ckpt_edit.py reseal FILE                       stamp the length and the CRC32C again
  ckpt_edit.py random FILE SEED [--reseal]        one to four random bytes changed
  ckpt_edit.py downgrade FILE                    format 4 to 3: meta.loom without its lineage; resealed

--reseal writes the stamp's checksum anew, so that the reader's range checks,
not its checksum, must catch the damage. The layout is the one core/train/ckpt_format.c
writes: a fixed header (meta.loom 112 bytes, a shard 16), the stamp (run id
u64, step i64, bytes u64, crc32c u32, reserved u32), then the body (meta.loom's
from format 4: the lineage, 32 bytes and the settings' text of the length at
its byte 24; the data position; the shard table); the
checksum is the CRC32C of the body continued over the header and the stamp
with its checksum field zero.
"""
import random
import struct
import sys

STAMP = struct.Struct("<QqQII")
META_HEAD, SHARD_HEAD = 112, 16
# meta.loom's fixed header: the consolidated state's, then tp, files, strategy
META_FIELDS = {
    "version": (8, "<I"), "dtype": (12, "<I"),
    "max_seq": (16, "<i"), "vocab": (20, "<i"), "layers": (24, "<i"), "heads": (28, "<i"),
    "channels": (32, "<i"), "padded_vocab": (36, "<i"),
    "step": (40, "<q"), "good_steps": (48, "<q"), "data": (56, "<Q"),
    "loss_scale": (64, "<f"), "nunits": (68, "<I"), "tp": (72, "<I"), "files": (76, "<I"),
    "strategy": (80, "32s"),
}
SHARD_FIELDS = {"version": (8, "<I"), "records": (12, "<I")}
RECORD_FIELDS = {"unit": (0, "<i"), "tp_rank": (4, "<i"), "begin": (8, "<Q"), "count": (16, "<Q")}

_TABLE = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    _TABLE.append(c)


def crc32c_extend(crc, data):
    c = crc ^ 0xFFFFFFFF
    table = _TABLE
    for b in data:
        c = (c >> 8) ^ table[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


def head_bytes(data):
    if data[:8] == b"LOOMMETA":
        return META_HEAD
    if data[:8] == b"LOOMSHRD":
        return SHARD_HEAD
    if data[:8] == b"LOOMSTAT":
        return 72
    return None


def reseal(data):
    h = head_bytes(data)
    if h is None:  # its magic is damaged: nothing to stamp
        return
    run_id, step, _, _, _ = STAMP.unpack_from(data, h)
    stamp = STAMP.pack(run_id, step, len(data), 0, 0)
    crc = crc32c_extend(0, data[h + STAMP.size:])
    crc = crc32c_extend(crc, data[:h])
    crc = crc32c_extend(crc, stamp)
    data[h:h + STAMP.size] = STAMP.pack(run_id, step, len(data), crc, 0)


def table_at(data):
    """Where meta.loom's shard table starts: past the lineage and the data position."""
    at = META_HEAD + STAMP.size
    if struct.unpack_from("<I", data, 8)[0] >= 4:
        at += 32 + struct.unpack_from("<I", data, at + 24)[0]
    return at + struct.unpack_from("<Q", data, 56)[0]


def put(data, offset, fmt, value):
    if fmt.endswith("s"):
        value = value.encode()
    elif fmt[-1] in "f":
        value = float(value)
    else:
        value = int(value, 0)
    struct.pack_into(fmt, data, offset, value)


def main():
    args = sys.argv[1:]
    sealing = "--reseal" in args
    args = [a for a in args if a != "--reseal"]
    what, path = args[0], args[1]
    data = bytearray(open(path, "rb").read())
    if what == "set":
        fields = META_FIELDS if data[:8] == b"LOOMMETA" else SHARD_FIELDS
        offset, fmt = fields[args[2]]
        put(data, offset, fmt, args[3])
    elif what == "record":
        offset, fmt = RECORD_FIELDS[args[2]]
        put(data, SHARD_HEAD + STAMP.size + offset, fmt, args[3])
    elif what == "table":
        unit, begin = int(args[2]), int(args[3], 0)
        count = int(args[4], 0) if len(args) > 4 else None
        tp = struct.unpack_from("<I", data, 72)[0]
        at = table_at(data)
        for u in range(unit + 1):
            nt = struct.unpack_from("<I", data, at)[0]
            at += 4
            for i in range(tp * nt):
                if u == unit:
                    struct.pack_into("<q", data, at + 16 * i, begin)
                    if count is not None:
                        struct.pack_into("<q", data, at + 16 * i + 8, count)
            at += 16 * tp * nt
    elif what == "poke":
        offset = int(args[2])
        raw = bytes.fromhex(args[3])
        offset = offset if offset >= 0 else len(data) + offset
        data[offset:offset + len(raw)] = raw
    elif what == "random":
        rng = random.Random(int(args[2]))
        # mostly the fields: the header, the stamp's run id and step, and
        # meta.loom's shard table or a shard's first records
        if data[:8] == b"LOOMMETA":
            head = META_HEAD
            fields = [(0, head + 16), (table_at(data), len(data))]
        else:
            head = SHARD_HEAD
            fields = [(0, head + 16), (head + STAMP.size, head + STAMP.size + 24)]
        for _ in range(rng.randint(1, 4)):
            lo, hi = rng.choice(fields) if rng.random() < 0.9 else (0, len(data))
            data[rng.randrange(lo, max(hi, lo + 1))] = rng.randrange(256)
    elif what == "downgrade":
        if data[:8] == b"LOOMMETA":
            at = META_HEAD + STAMP.size
            del data[at:at + 32 + struct.unpack_from("<I", data, at + 24)[0]]
        struct.pack_into("<I", data, 8, 3)
        sealing = True
    elif what != "reseal":
        sys.exit("ckpt_edit: unknown command " + what)
    if sealing or what == "reseal":
        reseal(data)
    open(path, "wb").write(data)


main()
