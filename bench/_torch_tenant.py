"""The tenant of bench/bench_torch_fairness.py: an unmodified torch program (run in the torch test venv with
the share's libraries preloaded) that loops one NPU op, synchronizing every K ops, and prints
``<ops done> <time.monotonic()>`` after each synchronize. It runs until killed.

* ``matmul N K``: the product of two N x N float32 matrices;
* ``gather M K``: ``torch.nn.functional.embedding`` of 8 rows out of an M MiB float32 table of 1024 columns
  (the die moves the table; the host copies 8 rows).
"""

import sys
import time

import torch
import torch_npu  # noqa: F401

KIND, SIZE, K = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
if KIND == "matmul":
    a, b = torch.randn(SIZE, SIZE).npu(), torch.randn(SIZE, SIZE).npu()

    def op():
        return a @ b
else:
    table = torch.ones((SIZE << 20) // 4096, 1024, device="npu")
    idx = torch.arange(8).npu()

    def op():
        return torch.nn.functional.embedding(idx, table)


done = 0
print(f"0 {time.monotonic()}", flush=True)
with torch.no_grad():
    while True:
        for _ in range(K):
            op()
        torch.npu.synchronize()
        done += K
        print(f"{done} {time.monotonic()}", flush=True)
