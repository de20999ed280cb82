"""Run by tests/integration/test_torch_operators.py with the PyTorch test venv, against a share: every case
computes on the NPU (through torch_npu and the share's client libraries) and on the CPU, and prints
``case <name> <max abs error>`` or ``case <name> FAILED <message>``. Not a test module itself."""

import math

import torch
import torch_npu  # noqa: F401  (registers the npu device)
from torch import nn
from torch.nn import functional as nnf


class Block(nn.Module):
    """A GPT-style block: embeddings, layer norm, causal self-attention with softmax, GELU MLP, residuals."""

    def __init__(self, d: int = 32, heads: int = 4, t: int = 8, vocab: int = 50) -> None:
        super().__init__()
        self.heads = heads
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Embedding(t, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        b, t = idx.shape
        x = self.emb(idx) + self.pos(torch.arange(t, device=idx.device))
        q, k, v = self.qkv(self.ln1(x)).split(x.shape[-1], dim=2)
        hs = x.shape[-1] // self.heads
        q, k, v = (z.view(b, t, self.heads, hs).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        mask = torch.tril(torch.ones(t, t, device=idx.device)).bool()
        att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).contiguous().view(b, t, -1))
        return x + self.out(nnf.gelu(self.fc(self.ln2(x))))


def case(name, fn, *args):
    try:
        with torch.no_grad():
            want = fn(*args)
            got = fn(*[a.npu() if isinstance(a, torch.Tensor) else a for a in args]).cpu()
        print(f"case {name} {(got.double() - want.double()).abs().max().item():.3e}", flush=True)
    except Exception as exc:  # the test reads the message
        print(f"case {name} FAILED {str(exc).splitlines()[0][:300]}", flush=True)


torch.manual_seed(0)
x, a, b = torch.randn(2, 8, 32), torch.randn(8, 16), torch.randn(16, 4)
block = Block().eval()
idx = torch.randint(0, 50, (2, 8))
case("ones-add", lambda t: torch.ones(4, device=t.device) + 1, x)
case("matmul", lambda p, q: p @ q, a, b)
case("gpt-block", lambda i: block.to(i.device)(i), idx)
mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32)).eval()
case("mlp", lambda t: mlp.to(t.device)(t), x)
rms = nn.RMSNorm(32)
case("rms-norm", lambda t: rms.to(t.device)(t), x)
case("silu-sin-cos", lambda t: nnf.silu(t) * torch.sin(t) + torch.cos(t), x)
case("rotate-half-cat", lambda t: torch.cat((-t[..., 16:], t[..., :16]), dim=-1), x)
case("sum-mean-max-argmax", lambda t: t.sum(1) + t.mean(1) + t.amax(1) + t.argmax(1).float(), x)
case("where-clamp-cumsum", lambda t: torch.where(t > 0, t, 0.0).clamp(max=1.0).cumsum(-1), x)
case(
    "topk-index-flip",
    lambda t: t.topk(3, -1).values + t[:, [0, 3, 5]].flip(1).sum(1, keepdim=True)[..., :3],
    x,
)
case("var-std", lambda t: t.var(-1) + t.std(-1), x)
case("log-softmax-tanh-gelu", lambda t: nnf.log_softmax(t, -1) + torch.tanh(t), x)
case("half-softmax", lambda t: (t.half() * 2 + 1).softmax(-1).float(), x)
case(
    "bf16-linear-softmax",
    lambda t: (t.bfloat16() @ t.bfloat16().transpose(-1, -2) / 8).softmax(-1).float(),
    x,
)
case(
    "sdpa-causal",
    lambda q, k, v: nnf.scaled_dot_product_attention(q, k, v, is_causal=True),
    *torch.randn(3, 2, 4, 8, 8),
)
