"""arbiter.Communicator on CUDA tensors (torch), where a GPU and torch are present:
one rank with default options (the nccl fallback runs the norm), in place as
vLLM calls it, on torch's current stream when no stream is named, under
CUDA-graph capture (eager and through the op), compiled by torch.compile
(inductor, and with CUDA graphs), and two ranks on one GPU through the
shared-GPU test mode (trtllm fused; created from the launcher's environment
and from a gloo group), checked against torch and across ranks.

Skips everything, with the reason, without torch or a CUDA device (the line
starts with "arbiter-gpu-skip:" so that ctest reports the test as skipped).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import arbiter

torch = pytest.importorskip("torch", reason="arbiter-gpu-skip: torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("arbiter-gpu-skip: torch sees no CUDA device", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "gpu_worker.py")
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(arbiter.__file__)))
CAPABILITY = torch.cuda.get_device_capability(0)
HIDDEN = 4096


class SoloGroup:
    def allgather(self, data: bytes) -> list[bytes]:
        return [data]


def torch_reference(total, residual, weight, eps):
    """What the fused call must produce from the all-reduced sum `total`
    (already rounded to the dtype): residual_out exactly, norm_out as torch's
    rms_norm of it in fp32."""
    residual_out = (total.float() + residual.float()).to(total.dtype)
    x = residual_out.float()
    norm = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    return residual_out, norm


def assert_norm_close(got, ref):
    """Within one unit in the last place of the dtype (relative), as the
    kernels and torch round the same fp32 value, summed in another order."""
    ulp = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-22}[got.dtype]
    err = (got.float() - ref).abs()
    bound = ulp * ref.abs() + 1e-6
    assert bool((err <= bound).all()), f"max error {float(err.max())}"


@pytest.fixture(scope="module")
def comm():
    with arbiter.Communicator(SoloGroup(), rank=0, world_size=1, local_rank=0, hidden=HIDDEN,
                              dtype="bf16", capability=CAPABILITY) as c:
        yield c


def inputs(tokens, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, HIDDEN, device="cuda", generator=g).bfloat16()
    residual = torch.randn(tokens, HIDDEN, device="cuda", generator=g).bfloat16()
    weight = (1 + 0.1 * torch.randn(HIDDEN, device="cuda", generator=g)).bfloat16()
    return x, residual, weight


@pytest.mark.parametrize("tokens", [1, 7, 128, 512])
def test_one_rank_with_default_options_matches_torch(comm, tokens):
    x, residual, weight = inputs(tokens)
    out = {"residual_out": torch.empty_like(x), "norm_out": torch.empty_like(x)}
    stream = torch.cuda.current_stream()
    r = comm.allreduce_fusion(x, residual, weight, eps=1e-6, out=out, stream=stream)
    stream.synchronize()
    assert (r.decision.backend, r.decision.fused) == ("nccl", False)
    residual_ref, norm_ref = torch_reference(x, residual, weight, 1e-6)
    assert torch.equal(out["residual_out"], residual_ref)
    assert_norm_close(out["norm_out"], norm_ref)


def test_in_place_as_vllm_calls_it(comm):
    x, residual, weight = inputs(64, seed=1)
    residual_ref, norm_ref = torch_reference(x, residual, weight, 1e-5)
    stream = torch.cuda.current_stream()
    comm.allreduce_fusion(x, residual, weight, eps=1e-5,
                          out={"norm_out": x, "residual_out": residual}, stream=stream)
    stream.synchronize()
    assert torch.equal(residual, residual_ref)
    assert_norm_close(x, norm_ref)


def test_a_captured_call_replays_on_new_inputs(comm):
    x, residual, weight = inputs(16, seed=2)
    out = {"residual_out": torch.empty_like(x), "norm_out": torch.empty_like(x)}
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # once eagerly: NCCL connects on first use
        comm.allreduce_fusion(x, residual, weight, out=out, stream=stream)
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        comm.allreduce_fusion(x, residual, weight, out=out, stream=stream)
    for seed in (3, 4):
        nx, nresidual, _ = inputs(16, seed=seed)
        x.copy_(nx)
        residual.copy_(nresidual)
        graph.replay()
        torch.cuda.synchronize()
        residual_ref, norm_ref = torch_reference(x, residual, weight, 1e-6)
        assert torch.equal(out["residual_out"], residual_ref)
        assert_norm_close(out["norm_out"], norm_ref)


def test_without_a_stream_the_call_runs_on_torchs_current_stream(comm):
    x, residual, weight = inputs(32, seed=5)
    new_x, _, _ = inputs(32, seed=6)
    residual_ref, norm_ref = torch_reference(new_x, residual, weight, 1e-6)
    out = {"residual_out": torch.empty_like(x), "norm_out": torch.empty_like(x)}
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # holds the side stream back ~50-100 ms
        x.copy_(new_x)  # so only a call queued behind it sees the new values
        r = comm.allreduce_fusion(x, residual, weight, out=out)
    side.synchronize()
    assert r.decision.backend == "nccl"
    assert torch.equal(out["residual_out"], residual_ref)
    assert_norm_close(out["norm_out"], norm_ref)


@pytest.mark.parametrize("how", ["eager", "op"])
def test_capture_without_a_stream_replays_on_new_inputs(comm, how):
    x, residual, weight = inputs(16, seed=7)
    out = {"residual_out": torch.empty_like(x), "norm_out": torch.empty_like(x)}

    def call():
        if how == "eager":
            comm.allreduce_fusion(x, residual, weight, out=out)
        else:
            torch.ops.arbiter.allreduce_fusion(comm.op_handle, 1, x, residual, weight, None,
                                               out["residual_out"], out["norm_out"])

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # once eagerly: NCCL connects on first use
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for seed in (8, 9):
        nx, nresidual, _ = inputs(16, seed=seed)
        x.copy_(nx)
        residual.copy_(nresidual)
        graph.replay()
        torch.cuda.synchronize()
        residual_ref, norm_ref = torch_reference(x, residual, weight, 1e-6)
        assert torch.equal(out["residual_out"], residual_ref)
        assert_norm_close(out["norm_out"], norm_ref)


class Block(torch.nn.Module):
    """A layer's tail: an op that makes the activation (a stand-in for the
    projection), then arbiter in place as vLLM calls it."""

    def __init__(self, comm) -> None:
        super().__init__()
        self.comm = comm
        g = torch.Generator(device="cuda").manual_seed(11)
        self.norm_weight = torch.nn.Parameter((1 + 0.1 * torch.randn(
            HIDDEN, device="cuda", generator=g)).bfloat16())

    def forward(self, x, residual):
        # h is an intermediate, as a projection's output is, but exact in
        # bf16 (x * 2): eager and compiled then agree bit for bit whatever
        # GEMM algorithm each would have picked. The norm over h in place;
        # the residual into a new tensor, so that no graph input is mutated
        # and inductor may replay CUDA graphs.
        h = x * 2
        r = self.comm.allreduce_fusion(h, residual, self.norm_weight, eps=1e-5,
                                       out={"norm_out": h})
        return h, r.residual_out


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_torch_compile_on_cuda_matches_eager(comm, mode):
    from torch._dynamo.utils import counters

    block = Block(comm)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(block, fullgraph=True, mode=mode)
    for step in range(4):  # reduce-overhead: records CUDA graphs, then replays them
        x, residual, _ = inputs(8, seed=20 + step)
        with torch.no_grad():
            want = [t.clone() for t in block(x, residual)]
            got = [t.clone() for t in compiled(x, residual)]
        torch.cuda.synchronize()
        for a, b in zip(got, want):
            assert torch.equal(a, b), step
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    assert comm.last_decision.backend == "nccl"


def test_new_outputs_are_recorded_on_the_side_stream_that_writes_them(comm, monkeypatch):
    """Outputs arbiter makes (on the current stream) for a call on another
    stream are recorded on that stream (record_stream), so that torch's
    allocator does not hand their memory out again, once the caller drops
    them, while that stream may still write them. The caller's own outputs,
    and calls on the current stream, are left alone."""
    recorded = []
    real = torch.Tensor.record_stream

    def spy(tensor, stream):
        recorded.append((tensor.data_ptr(), stream.cuda_stream))
        real(tensor, stream)

    monkeypatch.setattr(torch.Tensor, "record_stream", spy)
    x, residual, weight = inputs(4)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    for stream in (side, side.cuda_stream):  # a torch stream, then a bare handle
        recorded.clear()
        r = comm.allreduce_fusion(x, residual, weight, stream=stream)
        want = {(r.residual_out.data_ptr(), side.cuda_stream),
                (r.norm_out.data_ptr(), side.cuda_stream)}
        assert set(recorded) == want, stream
    recorded.clear()
    mine = torch.empty_like(x)
    r = comm.allreduce_fusion(x, residual, weight, stream=side, out={"norm_out": mine})
    assert recorded == [(r.residual_out.data_ptr(), side.cuda_stream)]
    recorded.clear()
    comm.allreduce_fusion(x, residual, weight, stream=torch.cuda.current_stream())
    comm.allreduce_fusion(x, residual, weight)
    assert recorded == []
    side.synchronize()


def test_other_float8_formats_are_refused_on_cuda(comm):
    x, residual, weight = inputs(2)
    scale = torch.ones(1, device="cuda")
    for wrong in (torch.float8_e5m2, torch.float8_e4m3fnuz):
        out = {"residual_out": torch.empty_like(x),
               "quant_out": torch.empty(2, HIDDEN, dtype=wrong, device="cuda")}
        with pytest.raises(arbiter.ArbiterError, match="the kernels write float8 e4m3fn"):
            comm.allreduce_fusion(x, residual, weight, pattern="residual_rmsnorm_fp8",
                                  scale=scale, out=out)


def test_host_tensors_and_wrong_shapes_are_refused(comm):
    x, residual, weight = inputs(2)
    out = {"residual_out": torch.empty_like(x), "norm_out": torch.empty_like(x)}
    with pytest.raises(arbiter.ArbiterError, match="host memory"):
        comm.allreduce_fusion(x.cpu(), residual, weight, out=out)
    with pytest.raises(arbiter.ArbiterError, match="hidden"):
        comm.allreduce_fusion(x[:, :64].contiguous(), residual, weight, out=out)


def test_nvfp4_is_refused_below_capability_10(comm):
    if CAPABILITY[0] >= 10:
        pytest.skip("this GPU runs NVFP4")
    x, residual, weight = inputs(2)
    scale = torch.ones(1, device="cuda")
    out = {"residual_out": torch.empty_like(x),
           "quant_out": torch.empty(2, HIDDEN // 2, dtype=torch.uint8, device="cuda"),
           "scale_out": torch.empty(128 * HIDDEN // 16, dtype=torch.uint8, device="cuda")}
    with pytest.raises(arbiter.ArbiterError, match=r"residual_rmsnorm_fp4 \(NVFP4\)"):
        comm.allreduce_fusion(x, residual, weight, pattern="residual_rmsnorm_fp4", scale=scale,
                              out=out)


@pytest.mark.parametrize("bootstrap", ["environment", "group"])
def test_two_ranks_share_one_gpu_through_the_test_mode(tmp_path, bootstrap):
    arbiter_bin = os.environ.get("ARBITER_BIN", "arbiter")
    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE_PARENT + os.pathsep + env.get("PYTHONPATH", "")
    if torch.cuda.device_count() < 2:
        env["ARBITER_TEST_SHARED_GPU"] = "1"
    env.pop("ARBITER_CONFIG", None)
    env.pop("ARBITER_BACKENDS", None)
    cmd = [arbiter_bin, "launch", "--nproc", "2", "--timeout", "300", "--", sys.executable,
           WORKER, str(tmp_path), bootstrap]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=360)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    for rank in (0, 1):
        assert f"rank {rank}: OK" in log, log
    assert "trtllm oneshot fused" in log, log
    for rank in (0, 1):
        assert f"rank {rank}: registered: trtllm fused: ok" in log, log
        assert f"rank {rank}: registered in place: trtllm fused: ok" in log, log
    # Bit for bit the same on both ranks.
    for name in sorted(os.listdir(tmp_path)):
        if name.startswith("rank0-"):
            other = tmp_path / name.replace("rank0-", "rank1-")
            assert (tmp_path / name).read_bytes() == other.read_bytes(), name


def test_the_cuda_graph_example_of_the_docs_runs(tmp_path):
    """docs/integration.md's block marked `<!-- test: cuda -->`, on one rank."""
    sys.path.insert(0, HERE)
    from doc_blocks import doc_program

    program = tmp_path / "cuda_graphs.py"
    program.write_text(doc_program("cuda"))
    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE_PARENT + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [os.environ.get("ARBITER_BIN", "arbiter"), "launch", "--nproc", "1", "--timeout",
           "300", "--", sys.executable, str(program)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=360)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    assert "Decision(backend='nccl'" in log, log
