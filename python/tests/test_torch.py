"""arbiter with torch on one CPU rank: torch tensors read directly, outputs
made as torch tensors, float8 outputs only in the format the kernels write,
the op torch.ops.arbiter.allreduce_fusion (eager, its fake implementation,
torch.compile with fullgraph=True, in place as vLLM calls it), and clear
refusals (a ProcessGroup as the oob, mixed arrays, a closed communicator).

The fast path's results against DLPack's and numpy's at every dtype,
pattern and size, and the gloo group, are in test_torch_ranks.py (2 ranks).
"""

from __future__ import annotations

import datetime
import re

import pytest

import arbiter

torch = pytest.importorskip("torch")

HIDDEN = 64
TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


class SoloGroup:
    def allgather(self, data: bytes) -> list[bytes]:
        return [data]


class DlpackOnly:
    def __init__(self, tensor) -> None:
        self._tensor = tensor

    def __dlpack__(self, stream=None):
        return self._tensor.__dlpack__()

    def __dlpack_device__(self):
        return self._tensor.__dlpack_device__()


@pytest.fixture()
def comm():
    with arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=HIDDEN,
                              dtype="bf16") as c:
        yield c


def inputs(tokens=3, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, HIDDEN, generator=g).to(dtype)
    residual = torch.randn(tokens, HIDDEN, generator=g).to(dtype)
    weight = (1 + 0.1 * torch.randn(HIDDEN, generator=g)).to(dtype)
    return x, residual, weight


def reference(x, residual, weight, eps=1e-6):
    """residual_out exactly; norm_out in fp32 (the kernels round it once)."""
    residual_out = (x.float() + residual.float()).to(x.dtype)
    return residual_out, torch.nn.functional.rms_norm(residual_out.float(), (x.shape[1],),
                                                      weight.float(), eps)


def assert_norm(got, want):
    ulp = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-22}[got.dtype]
    error = (got.float() - want).abs()
    assert bool((error <= ulp * want.abs() + 1e-6).all()), float(error.max())


@pytest.mark.parametrize("dtype", sorted(TORCH_DTYPES))
def test_torch_tensors_in_torch_tensors_out(dtype):
    with arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=HIDDEN,
                              dtype=dtype) as comm:
        x, residual, weight = inputs(dtype=TORCH_DTYPES[dtype])
        r = comm.allreduce_fusion(x, residual, weight)
        assert isinstance(r.norm_out, torch.Tensor) and r.norm_out.dtype == x.dtype
        assert r.decision == comm.last_decision and r.decision.backend == "shm"
        residual_ref, norm_ref = reference(x, residual, weight)
        assert torch.equal(r.residual_out, residual_ref)
        assert_norm(r.norm_out, norm_ref)
        plain = comm.allreduce_fusion(x)
        assert torch.equal(plain.allreduce_out, x) and plain.norm_out is None
        # A norm pattern may also write the sum (one rank: x itself).
        both = comm.allreduce_fusion(x, residual, weight,
                                     out={"allreduce_out": torch.empty_like(x)})
        assert torch.equal(both.allreduce_out, x)
        assert torch.equal(both.residual_out, residual_ref)


def test_in_place_as_vllm_calls_it_eager_and_through_the_op(comm):
    for how in ("eager", "op"):
        x, residual, weight = inputs(seed=1)
        residual_ref, norm_ref = reference(x, residual, weight, 1e-5)
        if how == "eager":
            r = comm.allreduce_fusion(x, residual, weight, eps=1e-5,
                                      out={"norm_out": x, "residual_out": residual})
            assert r.norm_out is x and r.residual_out is residual
        else:
            assert torch.ops.arbiter.allreduce_fusion(
                comm.op_handle, int(arbiter.Pattern.RESIDUAL_RMSNORM), x, residual, weight,
                None, residual, x, eps=1e-5) is None
        assert torch.equal(residual, residual_ref), how
        assert_norm(x, norm_ref)


def test_tensors_that_require_grad_are_refused_while_grad_is_on(comm):
    # Written through data_ptr(), such a tensor's version never moved and no
    # grad_fn was made: backward() then ran on and gave a wrong gradient.
    for name in ("x", "residual", "weight", "norm_out"):
        for how in ("eager", "op"):
            x, residual, weight = inputs(seed=2)
            norm_out = torch.empty_like(x)
            tensors = {"x": x, "residual": residual, "weight": weight, "norm_out": norm_out}
            tensors[name].requires_grad_(True)
            with pytest.raises(arbiter.ArbiterError) as e:
                if how == "eager":
                    comm.allreduce_fusion(x, residual, weight, out={"norm_out": norm_out})
                else:
                    torch.ops.arbiter.allreduce_fusion(
                        comm.op_handle, int(arbiter.Pattern.RESIDUAL_RMSNORM), x, residual,
                        weight, None, None, norm_out)
            assert "requires grad" in e.value.message and "torch.no_grad()" in e.value.message
            assert name in e.value.message, e.value.message
            with torch.no_grad():  # how inference calls it: runs
                r = comm.allreduce_fusion(x, residual, weight, out={"norm_out": norm_out})
            assert r.norm_out is norm_out


def test_a_compiled_call_refuses_tensors_that_require_grad_while_tracing(comm):
    # AOTAutograd runs the compiled forward under no_grad, where the call
    # cannot see grad mode: refused while tracing (the program's, alike on
    # every rank), it was accepted and its part of the gradient dropped.
    def model(x, residual, weight):
        return comm.allreduce_fusion(x, residual, weight).norm_out + x

    for backend in ("eager", "aot_eager"):
        torch._dynamo.reset()
        x, residual, weight = inputs(seed=8)
        x.requires_grad_(True)
        with pytest.raises(Exception, match="x requires grad"):
            torch.compile(model, fullgraph=True, backend=backend)(x, residual, weight)


def test_a_write_bumps_the_version_so_backward_refuses_what_it_saved_before(comm):
    # x needs no grad, so grad mode lets it through; autograd saved it for
    # p's gradient, then the call wrote norm_out into it. Its version never
    # moved, and backward() computed p.grad from arbiter's output, silently.
    for how in ("eager", "op"):
        x, residual, weight = inputs(seed=4)
        p = torch.ones_like(x, dtype=torch.float32, requires_grad=True)
        loss = (p * x).sum()
        before = x._version
        if how == "eager":
            comm.allreduce_fusion(x, residual, weight, out={"norm_out": x})
        else:
            torch.ops.arbiter.allreduce_fusion(
                comm.op_handle, int(arbiter.Pattern.RESIDUAL_RMSNORM), x, residual, weight, None,
                residual, x)
        assert x._version > before, how
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()


def test_inference_tensors_are_written_only_inside_inference_mode(comm):
    # torch refuses its own in-place writes to them outside inference_mode().
    with torch.inference_mode():
        x, residual, weight = inputs(seed=5)
        out = torch.empty_like(x)
        comm.allreduce_fusion(x, residual, weight, out={"norm_out": out})
    with torch.no_grad(), pytest.raises(arbiter.ArbiterError, match=r"out\['norm_out'\]: an "
                                        "inference tensor written outside"):
        comm.allreduce_fusion(x.clone(), residual.clone(), weight, out={"norm_out": out})
    # Read, not written: an inference x is taken.
    with torch.no_grad():
        comm.allreduce_fusion(x, residual.clone(), weight, out={"norm_out": torch.empty_like(out)})


def test_tensors_arbiter_cannot_read_are_refused_by_name(comm):
    # A wrapper subclass (data_ptr() 0) given as residual was read as "no
    # residual", and as an output left unwritten, with success.
    from torch.testing._internal.two_tensor import TwoTensor

    x, residual, weight = inputs(seed=6)
    two = {"residual": TwoTensor(residual, residual.clone()),
           "weight": TwoTensor(weight, weight.clone()),
           "out['norm_out']": TwoTensor(torch.empty_like(x), torch.empty_like(x))}
    with torch.no_grad():
        for name, bad in two.items():
            args = {"residual": residual, "weight": weight, "out": None}
            if name == "out['norm_out']":
                args["out"] = {"norm_out": bad}
            else:
                args[name] = bad
            with pytest.raises(arbiter.ArbiterError) as e:
                comm.allreduce_fusion(x, args["residual"], args["weight"], out=args["out"])
            assert e.value.message.startswith(f"{name}: a TwoTensor without storage"), \
                e.value.message
        # Nested and mkldnn tensors: torch's own errors came out raw (a
        # jagged one, a subclass, took the op and was not joined).
        for layout in (torch.strided, torch.jagged):
            with pytest.raises(arbiter.ArbiterError, match="x: a nested tensor"):
                comm.allreduce_fusion(torch.nested.nested_tensor([x[0], x[1]], layout=layout),
                                      residual, weight)
        with pytest.raises(arbiter.ArbiterError, match="residual: a nested tensor"):
            comm.allreduce_fusion(x[:2].contiguous(),
                                  torch.nested.nested_tensor([residual[0], residual[1]]), weight)
        dense = inputs(dtype=torch.float32)[0]
        with arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=HIDDEN,
                                  dtype="fp32") as fp32:
            with pytest.raises(arbiter.ArbiterError, match="torch cannot make outputs like"):
                fp32.allreduce_fusion(dense.to_mkldnn())
            with pytest.raises(arbiter.ArbiterError, match="a tensor arbiter cannot read"):
                fp32.allreduce_fusion(dense.to_mkldnn(), out={"allreduce_out": dense})
        # An empty call (0 tokens) has data_ptr() 0 too, and runs.
        empty = torch.empty(0, HIDDEN, dtype=torch.bfloat16)
        comm.allreduce_fusion(empty, empty.clone(), weight)


def test_negative_views_are_refused_not_read_without_their_sign(comm):
    # torch._neg_view shares its base's memory and negates on read; read
    # through data_ptr() it lost its sign: a call returned x + residual where
    # the caller meant -x + residual, with success.
    for name in ("x", "residual", "weight", "norm_out", "scale"):
        x, residual, weight = inputs(seed=3)
        tensors = {"x": x, "residual": residual, "weight": weight,
                   "norm_out": torch.empty_like(x), "scale": torch.tensor([0.5])}
        tensors[name] = torch._neg_view(tensors[name])
        fp8 = name == "scale"
        with pytest.raises(arbiter.ArbiterError) as e:
            comm.allreduce_fusion(
                tensors["x"], tensors["residual"], tensors["weight"],
                pattern="residual_rmsnorm_fp8" if fp8 else "residual_rmsnorm",
                scale=tensors["scale"] if fp8 else None,
                out={"quant_out": torch.empty(x.shape, dtype=torch.float8_e4m3fn)} if fp8
                else {"norm_out": tensors["norm_out"]})
        assert e.value.message.startswith(name if name != "norm_out" else "out['norm_out']")
        assert "negative bit set" in e.value.message and ".resolve_neg()" in e.value.message
    # Resolved, the same values run and carry their sign; so do the op's
    # inputs, which torch's dispatcher resolves before the op sees them.
    x, residual, weight = inputs(seed=3)
    want = reference(-x, residual, weight)[0]
    r = comm.allreduce_fusion(torch._neg_view(x).resolve_neg(), residual, weight)
    assert torch.equal(r.residual_out, want)
    residual_out, norm_out = torch.empty_like(x), torch.empty_like(x)
    torch.ops.arbiter.allreduce_fusion(comm.op_handle, int(arbiter.Pattern.RESIDUAL_RMSNORM),
                                       torch._neg_view(x), residual, weight, None, residual_out,
                                       norm_out)
    assert torch.equal(residual_out, want)


def test_fp8_output_is_e4m3fn_and_other_float8_formats_are_refused(comm):
    x, residual, weight = inputs()
    r = comm.allreduce_fusion(x, residual, weight, pattern="residual_rmsnorm_fp8", scale=0.5)
    assert r.quant_out.dtype == torch.float8_e4m3fn
    raw = torch.empty(3, HIDDEN, dtype=torch.uint8)
    comm.allreduce_fusion(x, residual, weight, pattern="residual_rmsnorm_fp8", scale=0.5,
                          out={"quant_out": raw})
    assert torch.equal(r.quant_out.view(torch.uint8), raw)
    # What the kernels wrote, read as e4m3fn, is the norm divided by the scale.
    _, norm_ref = reference(x, residual, weight)
    assert torch.allclose(r.quant_out.float() * 0.5, norm_ref, rtol=2.0**-3, atol=2.0**-9)
    for wrong in (torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz):
        for how, quant in (("torch", torch.empty(3, HIDDEN, dtype=wrong)),
                           ("dlpack", None)):
            if how == "dlpack":
                quant = DlpackOnly(torch.empty(3, HIDDEN, dtype=wrong))
                args = [DlpackOnly(t) for t in (x, residual, weight)]
            else:
                args = [x, residual, weight]
            with pytest.raises(arbiter.ArbiterError, match="the kernels write float8 e4m3fn"):
                comm.allreduce_fusion(*args, pattern="residual_rmsnorm_fp8", scale=0.5,
                                      out={"quant_out": quant})


def test_nvfp4_outputs_are_made_and_refused_by_shm_with_the_reason(comm):
    x, residual, weight = inputs()
    with pytest.raises(arbiter.ArbiterError, match="shm: does not run residual_rmsnorm_fp4"):
        comm.allreduce_fusion(x, residual, weight, pattern="residual_rmsnorm_fp4", scale=1.0)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: a.update(x=a["x"].float()), "x: element type fp32, expected bf16"),
        (lambda a: a.update(x=a["x"][:, :32]), "x: hidden 32; the communicator was created"),
        (lambda a: a.update(x=a["x"].t().contiguous().t()), "x: the tensor is not C-contiguous"),
        (lambda a: a.update(residual=a["residual"].t().contiguous()),
         "residual: shape (64, 3), expected (3, 64)"),
        (lambda a: a.update(weight=a["weight"][:32]), "weight: shape (32,), expected (64,)"),
        (lambda a: a.update(x=a["x"].to("meta")), "x: the tensor is in meta memory"),
        (lambda a: a.update(out={"norm_out": a["x"].view(torch.int16).numpy()}),
         "out['norm_out']: a ndarray; the other arguments are torch tensors"),
        (lambda a: a.update(out={"sum": a["x"]}), "out: unknown keys ['sum']"),
        (lambda a: a.update(out=[a["x"]]), "out: a list; pass a dict of output name -> tensor"),
        (lambda a: a.update(out="norm_out"), "out: a str; pass a dict"),
        (lambda a: a.update(out={"norm_out": None}), "out: norm_out is required"),
        (lambda a: a.update(stream=7), "stream: this communicator runs on host memory"),
        (lambda a: a.update(eps=float("nan")), "eps nan must be finite"),
        (lambda a: a.update(residual=a["residual"].tolist()),
         "residual: a list; the other arguments are torch tensors"),
        (lambda a: a.update(eps=True), "eps must be a real number (a Python or numpy float), "
                                       "not builtins.bool"),
        (lambda a: a.update(eps=1e300), "eps 1e+300 must be finite and >= 0, within float32's"),
        (lambda a: a.update(weight_bias=-(10**400)), "weight_bias -1000000000"),
        (lambda a: a.update(pattern="residual_rmsnorm_fp8", scale=1e-50,
                            out={"quant_out": torch.empty(3, 64, dtype=torch.uint8)}),
         "scale 1e-50 must be finite and > 0 (a float32 holds none below 1.4012985e-45)"),
        (lambda a: a.update(eps=torch.tensor(1e-6)),
         "eps must be a real number (a Python or numpy float), not torch.Tensor"),
        (lambda a: a.update(pattern="softmax"), "unknown pattern 'softmax'"),
        (lambda a: a.update(scale=1.0), "pattern residual_rmsnorm takes no scale"),
        (lambda a: a.update(residual_replicated="yes"), "must be True or False"),
    ],
)
def test_bad_calls_say_what_is_wrong(comm, change, message):
    x, residual, weight = inputs()
    args = {"x": x, "residual": residual, "weight": weight}
    change(args)
    with pytest.raises(arbiter.ArbiterError, match=re.escape(message)):
        comm.allreduce_fusion(**args)


def test_the_op_refuses_a_closed_communicator_and_a_bad_pattern():
    comm = arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=HIDDEN, dtype="bf16")
    handle = comm.op_handle
    x, residual, weight = inputs()
    with pytest.raises(arbiter.ArbiterError, match="pattern 7: pass int"):
        torch.ops.arbiter.allreduce_fusion(handle, 7, x, residual, weight, None, residual, x)
    comm.close()
    with pytest.raises(arbiter.ArbiterError, match=f"communicator {handle} was closed"):
        torch.ops.arbiter.allreduce_fusion(handle, 1, x, residual, weight, None, residual, x)
    with arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=HIDDEN,
                              dtype="bf16") as other:
        assert other.op_handle != handle  # handles are never reused


def test_a_process_group_as_the_oob_points_to_from_process_group():
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("this torch has no torch.distributed")
    store = dist.HashStore()
    for group in (dist.ProcessGroup(store, 0, 1),
                  dist.ProcessGroupGloo(store, 0, 1, datetime.timedelta(seconds=5))):
        with pytest.raises(arbiter.ArbiterError, match="Communicator.from_process_group"):
            arbiter.Communicator(group, rank=0, world_size=1, hidden=HIDDEN, dtype="bf16")
        # Without rank and world_size too (a group knows its own): the same pointer.
        with pytest.raises(arbiter.ArbiterError, match="Communicator.from_process_group"):
            arbiter.Communicator(group, hidden=HIDDEN, dtype="bf16")
    with pytest.raises(arbiter.ArbiterError, match="rank and world_size: pass"):
        arbiter.Communicator(object(), hidden=HIDDEN, dtype="bf16")
    with pytest.raises(arbiter.ArbiterError, match="torch.distributed is not initialised"):
        arbiter.Communicator.from_process_group(hidden=HIDDEN, dtype="bf16")


def test_from_process_group_refuses_a_destroyed_group_as_an_arbiter_error(tmp_path):
    # torch's ValueError ("Group ... is not registered") came out raw.
    import subprocess
    import sys

    script = (
        "import torch.distributed as dist, arbiter\n"
        f"dist.init_process_group('gloo', init_method='file://{tmp_path}/store', rank=0, "
        "world_size=1)\n"
        "group = dist.new_group([0], backend='gloo')\n"
        "dist.destroy_process_group(group)\n"
        "try:\n"
        "    arbiter.Communicator.from_process_group(group, hidden=64, dtype='fp32')\n"
        "except arbiter.ArbiterError as e:\n"
        "    print('ArbiterError', e.message)\n"
        "dist.destroy_process_group()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "ArbiterError from_process_group: torch.distributed does not know the group" in \
        done.stdout, done.stdout + done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch that sees no CUDA device")
def test_a_cuda_device_where_torch_sees_none_is_unavailable_not_a_torch_error():
    from arbiter._process_group import rank_device

    for device in ("cuda:0", 0, torch.device("cuda", 1)):
        with pytest.raises(arbiter.ArbiterError, match="torch sees no CUDA device here") as e:
            rank_device(device, None)
        assert e.value.status == arbiter.Status.UNAVAILABLE
    assert rank_device("cpu", None) == (None, "cpu")


class Block(torch.nn.Module):
    """A layer's tail as a tensor-parallel model writes it: a projection whose
    partial sums arbiter adds across ranks, with the residual and the norm."""

    def __init__(self, comm, through_op=False) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.comm, self.through_op = comm, through_op
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN, bias=False, dtype=torch.bfloat16)
        self.proj.weight.data = (torch.randn(HIDDEN, HIDDEN, generator=g) / 8).bfloat16()
        self.norm_weight = torch.nn.Parameter((1 + 0.1 * torch.randn(HIDDEN, generator=g))
                                              .bfloat16())

    def forward(self, x, residual):
        h = self.proj(x)
        if self.through_op:
            torch.ops.arbiter.allreduce_fusion(self.comm.op_handle, 1, h, residual,
                                               self.norm_weight, None, residual, h, eps=1e-5)
        else:
            r = self.comm.allreduce_fusion(h, residual, self.norm_weight, eps=1e-5,
                                           out={"norm_out": h, "residual_out": residual})
            assert r.decision is None or r.decision.backend == "shm"
        quant = self.comm.allreduce_fusion(h, residual, self.norm_weight,
                                           pattern="residual_rmsnorm_fp8", scale=0.25)
        return h * 2, quant.quant_out


def test_the_first_block_needs_no_residual_eager_through_the_op_and_compiled(comm):
    x, _, weight = inputs(seed=7)
    _, norm_ref = reference(x, torch.zeros_like(x), weight)
    r = comm.allreduce_fusion(x, None, weight)
    assert torch.equal(r.residual_out, x)  # the sum (one rank: x)
    assert_norm(r.norm_out, norm_ref)

    def first_block(x, weight):  # in place as vLLM would: residual_out over the input
        norm = torch.empty_like(x)
        torch.ops.arbiter.allreduce_fusion(
            comm.op_handle, int(arbiter.Pattern.RESIDUAL_RMSNORM), x, None, weight,
            None, x, norm, eps=1e-6)
        return norm

    y = x.clone()
    eager = first_block(y, weight)
    assert torch.equal(y, x) and torch.equal(eager, r.norm_out)
    torch._dynamo.reset()
    y = x.clone()
    compiled = torch.compile(first_block, fullgraph=True)(y, weight)
    assert torch.equal(y, x) and torch.equal(compiled, r.norm_out)


def run_block(block, x, residual):
    residual = residual.clone()
    with torch.no_grad():
        out, quant = block(x, residual)
    return out, quant.view(torch.uint8), residual


@pytest.mark.parametrize("through_op", [False, True])
def test_torch_compile_fullgraph_traces_the_op_and_matches_eager(comm, through_op):
    block = Block(comm, through_op)
    x, residual, _ = inputs(tokens=5, seed=4)
    eager = run_block(block, x, residual)
    graphs = []

    def record(gm, example_inputs):  # the graph dynamo hands a backend
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    traced = run_block(torch.compile(block, fullgraph=True, backend=record), x, residual)
    calls = [n for n in graphs[0].graph.nodes
             if n.op == "call_function" and "arbiter.allreduce_fusion" in str(n.target)]
    assert len(graphs) == 1 and len(calls) == 2, graphs[0].code
    # The traced call names the communicator by its handle, not a stale decision.
    assert calls[0].args[0] == comm.op_handle
    for got, want in zip(traced, eager):
        assert torch.equal(got, want)
    assert comm.last_decision.backend == "shm"


def test_torch_compile_with_inductor_matches_eager(comm):
    """The default backend: functionalised, then re-inplaced, then generated code."""
    block = Block(comm)
    x, residual, _ = inputs(tokens=5, seed=5)
    eager = run_block(block, x, residual)
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)
    for tokens in (5, 5, 2):  # the second call reuses the graph; 2 tokens another size
        x, residual, _ = inputs(tokens=tokens, seed=5)
        want = eager if tokens == 5 else run_block(block, x, residual)
        for got, expected in zip(run_block(compiled, x, residual), want):
            assert torch.equal(got, expected)


def test_a_compiled_call_refuses_what_the_eager_call_refuses_where_it_runs(comm):
    # Refused while tracing, the call never reached the peers, which waited
    # out their deadline (torch_worker's refusals scenario: joined now). The
    # compiled call refuses as it runs, with the eager call's error.
    def model(x, residual, weight):
        return comm.allreduce_fusion(x, residual, weight).norm_out

    torch._dynamo.reset()
    x, residual, weight = inputs()
    with pytest.raises(arbiter.ArbiterError, match=r"weight: shape \(32,\), expected \(64,\)"):
        torch.compile(model, fullgraph=True, backend="eager")(x, residual, weight[:32])


def test_a_numpy_scale_is_taken_eager_and_compiled_alike():
    import numpy as np

    def model(x, residual, weight, scale):
        return comm.allreduce_fusion(x, residual, weight, pattern="residual_rmsnorm_fp8",
                                     scale=scale).quant_out

    with arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=HIDDEN,
                              dtype="fp32") as comm, torch.no_grad():
        x, residual, weight = inputs(dtype=torch.float32, seed=7)
        eager = model(x, residual.clone(), weight, np.float32(0.5))
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend="eager")(
            x, residual.clone(), weight, np.float32(0.5))
        assert torch.equal(eager.view(torch.uint8), compiled.view(torch.uint8))
        assert torch.equal(eager.view(torch.uint8),
                           model(x, residual.clone(), weight, 0.5).view(torch.uint8))
        # Refused alike: True ran compiled as 1.0; 10**40 and 1e300 failed
        # to compile with torch's overflow error.
        for bad in (True, 10**40, 1e300):
            with pytest.raises(Exception, match=r"scale\b.*must be"):
                model(x, residual.clone(), weight, bad)
            torch._dynamo.reset()
            with pytest.raises(Exception, match=r"scale\b.*must be"):
                torch.compile(model, backend="eager")(x, residual.clone(), weight, bad)
        # A scale without storage of its own is named (C said "scale is NULL").
        from torch.testing._internal.two_tensor import TwoTensor

        one = torch.ones(1)
        with pytest.raises(arbiter.ArbiterError, match="scale: a TwoTensor without storage"):
            model(x, residual.clone(), weight, TwoTensor(one, one.clone()))


def test_a_dispatch_mode_sees_the_op(comm):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    x, residual, weight = inputs()
    with Seen() as mode:
        r = comm.allreduce_fusion(x, residual, weight)
    assert "arbiter.allreduce_fusion.default" in mode.ops
    residual_ref, _ = reference(x, residual, weight)
    assert r.decision is None and torch.equal(r.residual_out, residual_ref)


def test_numpy_empty_refuses_a_cuda_communicator_naming_torch_empty():
    """comm.empty() returns numpy (host) arrays; a CUDA communicator's
    registered memory is device memory, so it refuses and names
    arbiter.torch.empty, allocating nothing."""
    from arbiter.communicator import Communicator

    class CudaCommunicator:  # what empty() reads of a GPU Communicator
        _handle = 1
        device = 1
        dtype = arbiter.Dtype.BF16

        def _alloc(self, *args):
            raise AssertionError("allocated on a CUDA communicator")

    with pytest.raises(arbiter.ArbiterError) as e:
        Communicator.empty(CudaCommunicator(), (2, 8))
    assert e.value.status == arbiter.Status.UNSUPPORTED
    assert "CUDA device 1" in e.value.message and "arbiter.torch.empty" in e.value.message


def test_torch_empty_refuses_byte_counts_size_t_cannot_hold(comm):
    """They wrapped around to 0 bytes ("0 bytes per rank", a size nobody
    asked for) or to a few bytes, which were allocated and then failed in
    numpy; on a CUDA communicator the few bytes became the tensor's storage."""
    from arbiter import torch as arbiter_torch

    for shape, dtype in (((2**32, 2**32), torch.float32), ((2**62 + 4,), torch.float32),
                         ((2**63,), torch.bfloat16)):
        with pytest.raises(arbiter.ArbiterError, match="more than any allocation can hold"):
            arbiter_torch.empty(comm, shape, dtype)
    assert comm._registered == 0


def test_gloos_thread_never_frees_the_tensors_of_from_process_groups_exchange(monkeypatch):
    """gloo's worker thread lets go of an all_gather's tensors after wait()
    returns. Were its drop the one that frees a tensor's Python object, it would
    take the GIL on that thread, which aborts the process once the interpreter
    is exiting: the exchange frees them on the calling thread, every time."""
    import os
    import threading
    import weakref

    import torch.distributed as dist

    from arbiter._process_group import GroupOob

    if not dist.is_available():
        pytest.skip("this torch has no torch.distributed")
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs os.sched_setaffinity")
    caller, refs, elsewhere = threading.get_ident(), [], []
    all_gather = dist.all_gather

    def watched(parts, send, **kwargs):
        for tensor in (send, *parts):
            refs.append(weakref.ref(tensor, lambda _: threading.get_ident() != caller
                                    and elsewhere.append(1)))
        return all_gather(parts, send, **kwargs)

    monkeypatch.setattr(dist, "all_gather", watched)
    affinity = os.sched_getaffinity(0)
    # gloo's threads, started here, share this thread's one CPU: waking this
    # thread when the work completes preempts gloo's before it lets go (before
    # the fix, about one tensor in five was then freed on gloo's thread).
    os.sched_setaffinity(0, {min(affinity)})
    try:
        oob = GroupOob.__new__(GroupOob)  # a group of one, without init_process_group
        oob.group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1,
                                          datetime.timedelta(seconds=20))
        oob.rank, oob.size = 0, 1
        for i in range(200):
            assert oob.allgather(bytes([i]) * 3, 20.0) == [bytes([i]) * 3]
    finally:
        os.sched_setaffinity(0, affinity)
    assert len(refs) == 400 and all(ref() is None for ref in refs)
    assert not elsewhere, f"{len(elsewhere)} of 400 tensors freed on another thread"
