"""One rank of test_gpu.py's two-rank test, under `arbiter launch`: torch CUDA
tensors through Communicator.from_environment (argument "environment") or
Communicator.from_process_group over a gloo group (argument "group") on GPU
LOCAL_RANK, or GPU 0 in the shared-GPU test mode. Checks each call against
torch, writes its outputs (raw bytes) into the folder given, and prints
"rank R: OK"."""

from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist

import arbiter

HIDDEN = 4096


def main(folder: str, bootstrap: str) -> int:
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    shared = os.environ.get("ARBITER_TEST_SHARED_GPU") == "1"
    device = 0 if shared else int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(device)
    capability = torch.cuda.get_device_capability(device)
    if bootstrap == "group":
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
        comm = arbiter.Communicator.from_process_group(hidden=HIDDEN, dtype="bf16",
                                                       device=device, max_tokens=1024)
        stream = None  # torch's current stream
    else:
        comm = arbiter.Communicator.from_environment(hidden=HIDDEN, dtype="bf16",
                                                     capability=capability, device=device,
                                                     max_tokens=1024, timeout=120)
        stream = torch.cuda.current_stream()
    failures = 0
    for tokens in (1, 7, 128):
        g = torch.Generator(device="cuda").manual_seed(tokens)
        xs = [torch.randn(tokens, HIDDEN, device="cuda", generator=g).bfloat16()
              for _ in range(world)]
        residual = torch.randn(tokens, HIDDEN, device="cuda", generator=g).bfloat16()
        weight = (1 + 0.1 * torch.randn(HIDDEN, device="cuda", generator=g)).bfloat16()
        out = {"residual_out": torch.empty_like(residual), "norm_out": torch.empty_like(residual)}
        r = comm.allreduce_fusion(xs[rank], residual, weight, eps=1e-6, out=out, stream=stream)
        torch.cuda.current_stream().synchronize()
        # The kernels sum in fp32 in rank order, from +0.0, and round once.
        total = sum((x.float() for x in xs), torch.zeros_like(xs[0], dtype=torch.float32))
        residual_ref = (total.bfloat16().float() + residual.float()).bfloat16()
        x = residual_ref.float()
        norm_ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()
        err = (out["norm_out"].float() - norm_ref).abs()
        ok = torch.equal(out["residual_out"], residual_ref) and bool(
            (err <= 2.0**-7 * norm_ref.abs() + 1e-6).all())
        d = r.decision
        print(f"rank {rank}: {tokens} tokens: {d.backend} {d.algorithm} "
              f"{'fused' if d.fused else 'unfused'}: {'ok' if ok else 'WRONG'}", flush=True)
        failures += not ok
        for name, tensor in out.items():
            with open(os.path.join(folder, f"rank{rank}-{tokens}-{name}"), "wb") as f:
                f.write(tensor.cpu().view(torch.uint8).numpy().tobytes())
    # Registered memory (arbiter.torch.empty: trtllm maps it into every
    # rank): the same bits as the last plain call, in place too.
    registered = arbiter.torch.empty(comm, (tokens, HIDDEN))
    for in_place in (False, True):
        registered.copy_(xs[rank])
        got = {"residual_out": torch.empty_like(residual),
               "norm_out": registered if in_place else torch.empty_like(residual)}
        r = comm.allreduce_fusion(registered, residual, weight, eps=1e-6, out=got, stream=stream)
        torch.cuda.current_stream().synchronize()
        ok = all(torch.equal(got[name], out[name]) for name in out)
        d = r.decision
        print(f"rank {rank}: registered{' in place' if in_place else ''}: {d.backend} "
              f"{'fused' if d.fused else 'unfused'}: {'ok' if ok else 'WRONG'}", flush=True)
        failures += not ok
    del registered, got, r  # r.norm_out is the registered tensor: close() waits for none
    comm.close()
    if bootstrap == "group":
        dist.destroy_process_group()
    if failures == 0:
        print(f"rank {rank}: OK", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "environment"))
