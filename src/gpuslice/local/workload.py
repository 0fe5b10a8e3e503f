"""A small PyTorch load for demos and GPU tests: ``python -m gpuslice.local.workload NAME SECONDS ALLOC_MIB``.

Allocates ``ALLOC_MIB`` on the device, runs 2048² matmuls for ``SECONDS``, tries one allocation above what
CUDA reports as total (the slice limit under the enforcer), and prints one JSON line with the results.
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    import torch

    name, seconds, alloc_mib = argv[0], float(argv[1]), int(argv[2])
    held = torch.empty(alloc_mib * 2**20, dtype=torch.uint8, device="cuda")
    a = torch.randn(2048, 2048, device="cuda")
    b = torch.randn(2048, 2048, device="cuda")
    done, start = 0, time.time()
    while time.time() - start < seconds:
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
        done += 20
    rate = done / (time.time() - start)
    free, total = torch.cuda.mem_get_info()
    try:
        torch.empty(total + 2**30, dtype=torch.uint8, device="cuda")
        over = "allowed"
    except torch.cuda.OutOfMemoryError:
        over = "refused"
    except RuntimeError as exc:  # another CUDA error: report it rather than call it a refusal
        over = f"error: {str(exc).splitlines()[0][:120]}"
    print(json.dumps({"name": name, "matmul_per_s": round(rate, 1), "cuda_total": total, "cuda_free": free,
                      "held": held.numel(), "over_limit_alloc": over}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
