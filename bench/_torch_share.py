"""The share side of bench/bench_torch.py: an unmodified torch program (run in the torch test venv with the
share's libraries preloaded) that answers the parent's commands on stdin, one line each:

* ``op K``: K in-place adds of 1 to a 16-element float32 tensor, then a synchronize: seconds per op;
* ``gpt``: one forward pass of the GPT-style block (with a synchronize): seconds;
* ``quit``.
"""

import math
import sys
import time

import torch
import torch_npu  # noqa: F401

D, SEQ, BATCH, HEADS = (int(v) for v in sys.argv[1:5])


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(1000, D), torch.nn.Embedding(SEQ, D)
        self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.qkv, self.proj = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
        self.fc1, self.fc2 = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)

    def forward(self, idx):
        b, t = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        hs = D // HEADS
        q, k, v = (z.view(b, t, HEADS, hs).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        causal = torch.tril(torch.ones(t, t, device=idx.device)).bool()
        att = torch.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, -1)
        x = x + self.proj(y)
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


torch.manual_seed(0)
block = Block().to("npu")
idx = torch.randint(0, 1000, (BATCH, SEQ)).to("npu")
small = torch.zeros(16, device="npu")
with torch.no_grad():
    block(idx)
    torch.npu.synchronize()
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "op":
            k = int(cmd[1])
            t0 = time.perf_counter()
            for _ in range(k):
                small.add_(1)
            torch.npu.synchronize()
            print((time.perf_counter() - t0) / k, flush=True)
        elif cmd[0] == "gpt":
            t0 = time.perf_counter()
            block(idx)
            torch.npu.synchronize()
            print(time.perf_counter() - t0, flush=True)
        else:
            break
