"""An unmodified PyTorch program (tests/e2e/test_podman_torch.py runs it in a container given only a
share's CDI device): nothing here knows FlexNPU. It compares every NPU result with CPU torch and prints
one ``RESULT <json>`` line; it exits 0 only when it got that far."""

import json
import math
import sys

import torch
import torch_npu  # noqa: F401  (torch loads it anyway; an unmodified program imports it)

torch.manual_seed(0)
out = {"device_count": torch.npu.device_count(), "available": torch.npu.is_available()}


def err(npu_result, cpu_result):
    return float((npu_result.cpu() - cpu_result).abs().max())


a, b = torch.randn(16, 24), torch.randn(24, 8)
out["ones"] = err(torch.ones(4, 5, device="npu"), torch.ones(4, 5))
out["add"] = err(a.npu() + 1, a + 1)
out["matmul"] = err(a.npu() @ b.npu(), a @ b)

mlp = torch.nn.Sequential(torch.nn.Linear(24, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
x = torch.randn(32, 24)
want = mlp(x)
out["mlp"] = err(mlp.to("npu")(x.to("npu")), want)


class Block(torch.nn.Module):
    """A small GPT-style block: embeddings, layer norm, causal attention with softmax, GELU MLP, residuals."""

    def __init__(self, vocab=100, d=64, heads=4, seq=16):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(seq, d)
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, idx):
        b, t = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        q, k, v = self.qkv(self.ln1(x)).split(x.shape[-1], dim=-1)
        hs = x.shape[-1] // self.heads
        q, k, v = (z.view(b, t, self.heads, hs).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        causal = torch.tril(torch.ones(t, t, device=idx.device)).bool()
        att = torch.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, -1)
        x = x + self.proj(y)
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


block = Block()
idx = torch.randint(0, 100, (2, 16))
want = block(idx)
out["gpt"] = err(block.to("npu")(idx.to("npu")), want)

free, total = torch.npu.mem_get_info()
out["mem_free"], out["mem_total"] = free, total
try:
    torch.empty(total // 4 + (64 << 20), dtype=torch.float32, device="npu")
    out["oom"] = "no error"
except torch.OutOfMemoryError as exc:
    out["oom"] = type(exc).__name__ + ": " + str(exc).splitlines()[0][:160]
out["after_oom"] = err(torch.ones(3, device="npu") * 2, torch.full((3,), 2.0))
print("RESULT " + json.dumps(out), flush=True)
sys.exit(0)
