"""The same GPT-2 as loom's (llm.c's math: pre-LayerNorm, GELU tanh,
tied LM head, padded vocabulary), trained with AdamW on the CPU, to time
PyTorch against `loom train` on identical shapes.

    python3 torch_gpt2.py --layers 12 --channels 768 --heads 12 --vocab 50257 \
        --padded-vocab 50304 --batch 1 --seq 256 --threads 1 --steps 5 \
        [--data examples/data/corpus.bin]

--data reads the first batch x (seq + 1) tokens of an llm.c token shard (a
256-int32 header, then uint16 tokens), the batch loom's first step trains
on; without it the tokens are random.

Prints one line: the median step time (ms) and tokens/s over the steps after
the first (warm-up)."""
import argparse
import math
import struct
import statistics
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1 = torch.nn.LayerNorm(C, eps=1e-5)
        self.qkv = torch.nn.Linear(C, 3 * C)
        self.proj = torch.nn.Linear(C, C)
        self.ln2 = torch.nn.LayerNorm(C, eps=1e-5)
        self.fc = torch.nn.Linear(C, 4 * C)
        self.fcproj = torch.nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(torch.nn.Module):
    def __init__(self, L, C, NH, V, Vp, maxT):
        super().__init__()
        self.V = V
        self.wte = torch.nn.Embedding(Vp, C)
        self.wpe = torch.nn.Embedding(maxT, C)
        self.blocks = torch.nn.ModuleList(Block(C, NH) for _ in range(L))
        self.lnf = torch.nn.LayerNorm(C, eps=1e-5)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()
        logits = logits[..., : self.V]  # the padding is ignored, as in llm.c
        return F.cross_entropy(logits.reshape(-1, self.V), targets.reshape(-1))


def main():
    p = argparse.ArgumentParser()
    for name, default in [("layers", 12), ("channels", 768), ("heads", 12), ("vocab", 50257),
                          ("padded-vocab", 50304), ("batch", 1), ("seq", 256), ("threads", 1),
                          ("steps", 5)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--data", default="")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = GPT2(a.layers, a.channels, a.heads, a.vocab, a.padded_vocab, max(a.seq, 1024))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    n = a.batch * a.seq + 1
    if a.data:
        with open(a.data, "rb") as f:
            f.seek(256 * 4)
            raw = f.read(2 * n)
        tokens = torch.tensor(struct.unpack(f"<{n}H", raw), dtype=torch.long)
        # rows of seq + 1 tokens that overlap by one, as llm.c's loader reads them
        idx = torch.stack([tokens[b * a.seq: b * a.seq + a.seq + 1] for b in range(a.batch)])
    else:
        idx = torch.randint(0, 256, (a.batch, a.seq + 1))
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = model(idx[:, :-1], idx[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    ms = statistics.median(times[1:]) * 1e3
    print(f"torch {torch.__version__} threads {a.threads}: step {ms:.1f} ms, "
          f"{a.batch * a.seq / ms * 1e3:.0f} tok/s")


if __name__ == "__main__":
    main()
