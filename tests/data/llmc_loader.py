#!/usr/bin/env python3
"""llm.c's data order, written again from the algorithm (llmc/dataloader.h,
llmc/rand.h), independently of loom: the reference tests/data compares
loom's batches with.

The generator is CPython's own MT19937 (random.setstate with the 624 words
seeded the way llm.c and torch seed them), so the reference shares no code
with loom's model/mt19937.c.

  llmc_loader.py shards DIR SEED SIZE...
      write llm.c token shards DIR/shard_00.bin ... of SIZE random tokens (< 256)
  llmc_loader.py dump BATCH SEQ SHUFFLE READERS READ_BATCH STEPS FILE...
      print the global batch of each step: 'step N', then one line per
      sequence, its SEQ inputs and its last target
"""
import random
import struct
import sys

SHARD_MAGIC, SHARD_VERSION = 20240520, 1


class Twister:
    """llm.c's mt19937_state: seed words by Knuth's multiplier, draws by MT19937."""

    def __init__(self, seed):
        words = [seed & 0xFFFFFFFF]
        for i in range(1, 624):
            prev = words[-1]
            words.append((1812433253 * (prev ^ (prev >> 30)) + i) & 0xFFFFFFFF)
        self.gen = random.Random()
        # index 624: the first draw regenerates the whole state, as llm.c's does
        self.gen.setstate((3, tuple(words + [624]), None))

    def draw(self):
        return self.gen.getrandbits(32)


def permute(order, rng):
    for i in range(len(order) - 1, 0, -1):
        j = rng.draw() % (i + 1)
        order[i], order[j] = order[j], order[i]


def read_shard(path):
    with open(path, 'rb') as f:
        data = f.read()
    header = struct.unpack('<256i', data[:1024])
    assert header[0] == SHARD_MAGIC and header[1] == SHARD_VERSION, path
    count = header[2]
    assert len(data) == 1024 + 2 * count, path
    return list(struct.unpack('<%dH' % count, data[1024:]))


class Process:
    """One llm.c process's DataLoader: rank r of P, B sequences of T tokens."""

    def __init__(self, shards, B, T, rank, P, shuffle):
        self.shards, self.B, self.T, self.rank, self.P = shards, B, T, rank, P
        self.shuffle = shuffle
        self.stride = P * B * T
        for tokens in shards:
            assert len(tokens) >= self.stride + 1
        if shuffle:
            self.rng = Twister(42 + rank)
            self.shard_order = list(range(len(shards)))
        self.reset()

    def file(self):
        return self.shard_order[self.shard] if self.shuffle else self.shard

    def load_shard(self):
        self.samples = (len(self.shards[self.file()]) - 1) // self.stride
        if self.shuffle:
            self.sample_order = list(range(self.samples))
            permute(self.sample_order, self.rng)

    def reset(self):
        self.shard, self.sample = 0, 0
        if self.shuffle:
            permute(self.shard_order, self.rng)
        self.load_shard()

    def next_batch(self):
        if self.sample >= self.samples:
            if self.shard == len(self.shards) - 1:
                self.reset()
            else:
                self.shard += 1
                self.sample = 0
                self.load_shard()
        idx = self.sample_order[self.sample] if self.shuffle else self.sample
        self.sample += 1
        start = idx * self.stride + self.rank * self.B * self.T
        window = self.shards[self.file()][start:start + self.B * self.T + 1]
        return [window[j * self.T:(j + 1) * self.T + 1] for j in range(self.B)]


def check_twister():
    # llm.c's rand.h documents these (torch.manual_seed(137) gives the same)
    rng = Twister(137)
    got = [rng.draw() for _ in range(5)]
    assert got == [4053805790, 2173880614, 380293709, 1237255315, 2986595568], got


def main(argv):
    if argv[1] == 'shards':
        out, seed, sizes = argv[2], int(argv[3]), [int(s) for s in argv[4:]]
        rnd = random.Random(seed)
        for i, n in enumerate(sizes):
            header = [SHARD_MAGIC, SHARD_VERSION, n] + [0] * 253
            with open('%s/shard_%02d.bin' % (out, i), 'wb') as f:
                f.write(struct.pack('<256i', *header))
                f.write(struct.pack('<%dH' % n, *[rnd.randrange(256) for _ in range(n)]))
        return
    assert argv[1] == 'dump'
    check_twister()
    batch, seq, shuffle, readers, read_batch, steps = (int(a) for a in argv[2:8])
    shards = [read_shard(p) for p in argv[8:]]
    read_batch = read_batch or batch // readers
    procs = [Process(shards, read_batch, seq, r, readers, shuffle) for r in range(readers)]
    reads = batch // (readers * read_batch)
    lines = []
    for step in range(steps):
        lines.append('step %d' % (step + 1))
        for _ in range(reads):
            for p in procs:
                for s in p.next_batch():
                    lines.append(' '.join(str(t) for t in s))
    sys.stdout.write('\n'.join(lines) + '\n')


if __name__ == '__main__':
    main(sys.argv)
