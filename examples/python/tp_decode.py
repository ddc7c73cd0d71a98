"""A tensor-parallel model with arbiter's fused all-reduce + residual + RMSNorm
at the end of every layer: what a framework integration looks like end to end.

    arbiter launch --nproc 2 -- python3 examples/python/tp_decode.py                # CPU ranks
    arbiter launch --nproc 2 -- python3 examples/python/tp_decode.py --device cuda  # GPU ranks

Each layer is an MLP split the Megatron way: the up projection by columns
(each rank holds ffn / N of them), the down projection by rows, so each rank
ends the layer with a partial sum of the output. arbiter adds the partials
across ranks, adds the residual and normalises, in one call, and every rank
goes on with the same normalised activations. Every rank also computes the
same model unsplit, in one process, and checks that the split run matches it.

Rank 0 prints each layer's decision (backend, algorithm, fused) and the time
per step for decode-shaped (1-8 tokens) and prefill-shaped (hundreds of
tokens) calls. Exits non-zero when the split model drifts from the unsplit
one. Needs numpy; --device cuda needs torch and a GPU.

On GPUs rank r uses GPU LOCAL_RANK. With fewer GPUs than ranks (one GPU, say)
every rank uses GPU 0 through arbiter's shared-GPU test mode
(ARBITER_TEST_SHARED_GPU=1, set here): correct but slow, since the ranks'
kernels take turns, and without the nccl fallback (NCCL refuses two ranks on
one GPU), so only calls the tables fuse can run. It is for trying arbiter on
one GPU, never for a real job.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

# One compute thread per rank, as a framework runs its ranks: N ranks with a
# BLAS pool each would fight over the same cores.
for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import numpy as np  # noqa: E402  (after the thread settings)

try:
    import arbiter
except ImportError:  # run from a source tree: the package beside examples/
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, os.pardir, os.pardir, "python"))
    import arbiter

EPS = 1e-5


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (round to nearest even), as uint16: numpy has no bf16."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


class Codec:
    """Between the model's float32 and the all-reduce's dtype."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype

    def encode(self, values: np.ndarray) -> np.ndarray:
        if self.dtype == "bf16":
            return to_bf16_bits(values)
        # Always a new array: the caller may update it in place.
        return np.array(values, dtype=np.float16 if self.dtype == "fp16" else np.float32)

    def decode(self, values: np.ndarray) -> np.ndarray:
        return from_bf16_bits(values) if self.dtype == "bf16" else values.astype(np.float32)


def make_weights(layers: int, hidden: int, ffn: int, seed: int = 7):
    """The whole model; every rank builds the same one and keeps its shard."""
    rng = np.random.default_rng(seed)
    weights = []
    for _ in range(layers):
        # float32 throughout: numpy 2 promotes float32 / np.float64 to float64.
        up = (rng.standard_normal((hidden, ffn)) / np.sqrt(hidden)).astype(np.float32)
        down = (rng.standard_normal((ffn, hidden)) / np.sqrt(ffn)).astype(np.float32)
        gamma = rng.uniform(0.8, 1.2, hidden).astype(np.float32)
        weights.append((up, down, gamma))
    return weights


def rmsnorm(x: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + EPS) * gamma


def unsplit(weights, x: np.ndarray, codec: Codec) -> np.ndarray:
    """The model in one process, rounding where the split run stores values."""
    residual = codec.decode(codec.encode(x))
    h = residual
    for up, down, gamma in weights:
        out = np.maximum(h @ up, 0) @ down
        residual = codec.decode(codec.encode(residual + out))
        h = codec.decode(codec.encode(rmsnorm(residual, gamma)))
    return h


def split(comm, shards, x: np.ndarray, codec: Codec, decisions=None):
    """The model on this rank's shards."""
    residual = codec.encode(x)
    h = codec.decode(residual)
    for up, down, gamma in shards:
        partial = codec.encode(np.maximum(h @ up, 0) @ down)
        # In place, as vLLM does: the residual is updated where it lies. It
        # is the same on every rank (tensor parallelism replicates it), which
        # lets a two-shot split the norm's work across the ranks.
        result = comm.allreduce_fusion(partial, residual, gamma, eps=EPS,
                                       out={"residual_out": residual}, residual_replicated=True)
        if decisions is not None:
            decisions.append(result.decision)
        h = codec.decode(result.norm_out)
    return h


# ---------------------------------------------------------------- GPU ranks


def cuda_setup():
    """torch, and the GPU this rank uses; SystemExit with the reason when
    there is no torch or no GPU. Switches the shared-GPU test mode on when
    the ranks outnumber the GPUs."""
    try:
        import torch
    except ImportError as e:
        raise SystemExit(f"tp_decode: --device cuda needs torch ({e}); install it or run "
                         "without --device cuda (CPU ranks)") from None
    if not torch.cuda.is_available():
        raise SystemExit("tp_decode: --device cuda: torch sees no CUDA device (driver, "
                         "CUDA_VISIBLE_DEVICES?); run without --device cuda for CPU ranks")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    gpus = torch.cuda.device_count()
    shared = gpus < local_world
    if shared:
        os.environ["ARBITER_TEST_SHARED_GPU"] = "1"  # read when the communicator is created
    device = 0 if shared else local_rank
    torch.cuda.set_device(device)
    return torch, device, shared, gpus


class TorchModel:
    """The same model as the numpy one, on one GPU in torch: weights made
    on the host from the same seed, matmuls in fp32, activations stored in
    the all-reduce's dtype where the split run stores them."""

    def __init__(self, torch, weights, dtype: str, device: int) -> None:
        self.torch = torch
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
        self.device = torch.device("cuda", device)
        self.weights = [tuple(torch.from_numpy(w).to(self.device) for w in layer)
                        for layer in weights]

    def store(self, values):
        return values.to(self.dtype)

    def rmsnorm(self, x, gamma):
        return x * self.torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + EPS) * gamma

    def unsplit(self, weights, x):
        residual = self.store(x).float()
        h = residual
        for up, down, gamma in weights:
            out = self.torch.relu(h @ up) @ down
            residual = self.store(residual + out).float()
            h = self.store(self.rmsnorm(residual, gamma)).float()
        return h

    def split(self, comm, shards, x, stream, decisions=None):
        residual = self.store(x)
        h = residual.float()
        norm = self.torch.empty_like(residual)
        for up, down, gamma in shards:
            partial = self.store(self.torch.relu(h @ up) @ down)
            result = comm.allreduce_fusion(partial, residual, gamma, eps=EPS, stream=stream,
                                           out={"residual_out": residual, "norm_out": norm},
                                           residual_replicated=True)
            if decisions is not None:
                decisions.append(result.decision)
            h = norm.float()
        return h


def run_cuda(args, shapes) -> int:
    torch, device, shared, gpus = cuda_setup()
    capability = torch.cuda.get_device_capability(device)
    with arbiter.Communicator.from_environment(
        hidden=args.hidden, dtype=args.dtype, max_tokens=max(t for _, t in shapes),
        capability=capability, device=device
    ) as comm:
        n, rank = comm.world_size, comm.rank
        if args.ffn % n:
            raise SystemExit(f"--ffn {args.ffn} does not split over {n} ranks")
        model = TorchModel(torch, make_weights(args.layers, args.hidden, args.ffn), args.dtype,
                           device)
        per_rank = args.ffn // n
        shards = [(up[:, rank * per_rank:(rank + 1) * per_rank].contiguous(),
                   down[rank * per_rank:(rank + 1) * per_rank].contiguous(), model.store(g))
                  for up, down, g in model.weights]
        reference_weights = [(up, down, model.store(g).float()) for up, down, g in model.weights]
        lead = rank == 0
        if lead:
            where = (f"all on GPU 0 ({gpus} GPU(s) for {n} ranks: arbiter's shared-GPU test mode, "
                     "no nccl fallback)" if shared else "one GPU per rank")
            print(f"tp_decode: {n} ranks on {torch.cuda.get_device_name(device)} "
                  f"(capability {capability[0]}.{capability[1]}), {where}; hidden {args.hidden}, "
                  f"ffn {args.ffn} ({per_rank} per rank), {args.layers} layers, {args.dtype}; "
                  f"backends {', '.join(comm.backends)}; tables {comm.fingerprint_hex}",
                  flush=True)
        tolerance = {"fp32": 1e-4, "fp16": 5e-3, "bf16": 3e-2}[args.dtype]
        worst = 0.0
        stream = torch.cuda.current_stream()
        generator = torch.Generator().manual_seed(11)
        for kind, tokens in shapes:
            x = torch.randn(tokens, args.hidden, generator=generator).to(model.device)
            decisions = []
            got = model.split(comm, shards, x, stream, decisions)
            want = model.unsplit(reference_weights, x)
            drift = float((got - want).abs().max() / want.abs().max())
            worst = max(worst, drift)
            if lead:
                ways = sorted({f"{d.backend} {d.algorithm} {'fused' if d.fused else 'unfused'}"
                               for d in decisions})
                print(f"  {kind:7} {tokens:4} tokens x {args.hidden}: every layer "
                      f"{' / '.join(ways)}; max |split - unsplit| / max |unsplit| = {drift:.1e}",
                      flush=True)
            steps = args.steps if kind == "decode" else max(2, args.steps // 10)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(steps):
                model.split(comm, shards, x, stream)
            torch.cuda.synchronize()
            per_step = (time.perf_counter() - start) / steps
            if lead:
                print(f"          {per_step * 1e3:8.3f} ms per step"
                      + (" (ranks take turns on one GPU: not a speed figure)" if shared else ""),
                      flush=True)
        if worst > tolerance:
            print(f"rank {rank}: the split model drifted {worst:.1e} from the unsplit one "
                  f"(allowed {tolerance:.0e} for {args.dtype})", flush=True)
            return 1
        if lead:
            print(f"  every rank matches the unsplit model within {tolerance:.0e} ({args.dtype})",
                  flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--ffn", type=int, default=2048)
    parser.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    parser.add_argument("--decode-tokens", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--prefill-tokens", type=int, nargs="+", default=[128])
    parser.add_argument("--steps", type=int, default=10,
                        help="timed steps per decode shape (prefill: a tenth, at least 2)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: numpy on host memory (the shm backend); cuda: torch tensors "
                             "on GPU LOCAL_RANK (trtllm fused, nccl fallback)")
    args = parser.parse_args()

    shapes = [("decode", t) for t in args.decode_tokens] + [
        ("prefill", t) for t in args.prefill_tokens
    ]
    if args.device == "cuda":
        return run_cuda(args, shapes)
    codec = Codec(args.dtype)
    with arbiter.Communicator.from_environment(
        hidden=args.hidden, dtype=args.dtype, max_tokens=max(t for _, t in shapes)
    ) as comm:
        n, rank = comm.world_size, comm.rank
        if args.ffn % n:
            raise SystemExit(f"--ffn {args.ffn} does not split over {n} ranks")
        weights = make_weights(args.layers, args.hidden, args.ffn)
        per_rank = args.ffn // n
        gamma_dtype = [codec.encode(g) for _, _, g in weights]
        shards = [
            (up[:, rank * per_rank : (rank + 1) * per_rank].copy(),
             down[rank * per_rank : (rank + 1) * per_rank].copy(), g)
            for (up, down, _), g in zip(weights, gamma_dtype)
        ]
        # The unsplit model uses the gamma the split one sees.
        reference_weights = [(up, down, codec.decode(g)) for (up, down, _), g in
                             zip(weights, gamma_dtype)]
        lead = rank == 0
        if lead:
            print(f"tp_decode: {n} ranks, hidden {args.hidden}, ffn {args.ffn} ({per_rank} per "
                  f"rank), {args.layers} layers, {args.dtype}; backends {', '.join(comm.backends)}"
                  f"; tables {comm.fingerprint_hex}")
        tolerance = {"fp32": 1e-5, "fp16": 5e-3, "bf16": 3e-2}[args.dtype]
        worst = 0.0
        rng = np.random.default_rng(11)
        for kind, tokens in shapes:
            x = rng.standard_normal((tokens, args.hidden), dtype=np.float32)
            decisions = []
            got = split(comm, shards, x, codec, decisions)
            want = unsplit(reference_weights, x, codec)
            drift = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
            worst = max(worst, drift)
            if lead:
                ways = sorted({f"{d.backend} {d.algorithm} {'fused' if d.fused else 'unfused'}"
                               for d in decisions})
                print(f"  {kind:7} {tokens:4} tokens x {args.hidden}: every layer "
                      f"{' / '.join(ways)}; max |split - unsplit| / max |unsplit| = {drift:.1e}")
            steps = args.steps if kind == "decode" else max(2, args.steps // 10)
            start = time.perf_counter()
            for _ in range(steps):
                split(comm, shards, x, codec)
            per_step = (time.perf_counter() - start) / steps
            # The call alone, back to back (in a step it also absorbs the
            # ranks' skew: whoever finishes its matmul first waits).
            partial = codec.encode(x)
            residual = codec.encode(x)
            gamma = shards[0][2]
            calls = []
            for _ in range(steps * 5):
                start = time.perf_counter()
                comm.allreduce_fusion(partial, residual, gamma, eps=EPS, residual_replicated=True)
                calls.append(time.perf_counter() - start)
            if lead:
                print(f"          {per_step * 1e3:8.3f} ms per step; the arbiter call alone "
                      f"{sorted(calls)[len(calls) // 2] * 1e6:.0f} us (median of {len(calls)})")
        if worst > tolerance:
            print(f"rank {rank}: the split model drifted {worst:.1e} from the unsplit one "
                  f"(allowed {tolerance:.0e} for {args.dtype})", flush=True)
            return 1
        if lead:
            print(f"  every rank matches the unsplit model within {tolerance:.0e} ({args.dtype})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
