"""arbiter.Communicator runs fused all-reduce on CPU ranks (the shm backend),
started by `arbiter launch` at 2 and 4 ranks: every dtype and pattern shm
serves, fused and fallback sizes, in place, DLPack and the buffer protocol,
the caller's own group, bad calls, a rank that raises, mismatched tables.

Each rank runs comm_worker.py; this file compares what the ranks left behind
with an fp64 reference computed here, and across ranks bit for bit.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

import arbiter

np = pytest.importorskip("numpy")

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "comm_worker.py")
EXAMPLE = os.path.join(HERE, os.pardir, os.pardir, "examples", "python", "tp_decode.py")
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(arbiter.__file__)))
# Fused up to 256 KiB at 2 and 4 ranks, so the fallback is cheap to reach.
SITE = "format: 1\nfusion:\n" + "".join(
    f"  - {{capability: cpu, world_size: {ws}, max: 256KiB}}\n" for ws in (2, 4)
)
# Half an ulp at 1.0, relative.
UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8, "fp32": 2.0**-24}


def launch(arbiter_bin, tmp_path, nproc, scenario, timeout=240, site=True, program=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE_PARENT + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if site:
        (tmp_path / "site.yaml").write_text(SITE)
        env["ARBITER_CONFIG"] = str(tmp_path / "site.yaml")
    cmd = [arbiter_bin, "launch", "--nproc", str(nproc), "--timeout", str(timeout), "--",
           sys.executable] + (program or [WORKER, scenario, str(tmp_path)])
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout + 30)
    return done.returncode, done.stdout + done.stderr


def as_float(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bf16":
        return (values.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return values.astype(np.float64)


def e4m3_to_float(codes: np.ndarray) -> np.ndarray:
    codes = codes.astype(np.int64)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exponent, mantissa = (codes >> 3) & 0xF, codes & 0x7
    value = np.where(
        exponent == 0, mantissa / 8.0 * 2.0**-6, (1 + mantissa / 8.0) * 2.0 ** (exponent - 7)
    )
    return np.where((exponent == 15) & (mantissa == 7), np.nan, sign * value)


def reference(inputs, residual, weight, dtype, eps=1e-5):
    """The fp64 result and the error an implementation may make, as
    arbiter::common::compute_reference (reference.h) bounds it: fp32 sums,
    one rounding to dtype per stored value; outputs pass within 2x bound."""
    u32, ud = 2.0**-24, UNIT_ROUNDOFF[dtype]
    tiny = {"fp16": 2.0**-25, "bf16": 2.0**-134, "fp32": 2.0**-150}[dtype]
    total = sum(inputs)
    magnitude = sum(np.abs(v) for v in inputs)
    out = {"sum": total, "sum_bound": ud * np.abs(total) + len(inputs) * u32 * magnitude + tiny}
    if residual is None:
        return out
    x = total + residual
    bound = out["sum_bound"] + (ud + u32) * np.abs(x) + tiny
    hidden = x.shape[1]
    squares = np.sum(x * x, axis=1, keepdims=True)
    perturbation = np.sum(2 * np.abs(x) * bound + bound * bound, axis=1, keepdims=True)
    inv_rms = 1 / np.sqrt(squares / hidden + eps)
    inv_rms_error = 0.5 * (perturbation + hidden * u32 * squares) / (squares + hidden * eps)
    inv_rms_error += 4 * u32
    norm = x * inv_rms * weight
    out.update(residual=x, residual_bound=bound, norm=norm)
    out["norm_bound"] = (np.abs(weight) * inv_rms * (bound + np.abs(x) * inv_rms_error)
                         + (ud + 3 * u32) * np.abs(norm) + tiny)
    return out


def check_close(got, ref, bound, what):
    bad = ~(np.abs(got - ref) <= bound)
    if bad.any():
        i = np.argwhere(bad)[0]
        pytest.fail(
            f"{what}: {bad.sum()} elements off, first at {tuple(i)}: got {got[tuple(i)]}, "
            f"reference {ref[tuple(i)]}, bound {bound[tuple(i)]}"
        )


def check_ranks(tmp_path, nproc):
    """Every rank's outputs equal bit for bit, and within rounding of fp64."""
    runs = [np.load(tmp_path / f"rank{r}.npz") for r in range(nproc)]
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(nproc)]
    assert all(rec == records[0] for rec in records), "ranks took different decisions"
    outputs = [k for k in runs[0].files if k.rsplit("/", 1)[1].endswith("_out")]
    assert outputs
    for key in outputs:
        for r in range(1, nproc):
            assert np.array_equal(runs[r][key].view(np.uint8), runs[0][key].view(np.uint8)), (
                f"{key}: rank {r} differs from rank 0"
            )
    cases = sorted({k.rsplit("/", 1)[0] for k in outputs})
    for case in cases:
        dtype, pattern = case.split("-")[:2]
        got = {k.rsplit("/", 1)[1]: runs[0][k] for k in outputs if k.startswith(case + "/")}
        inputs = [as_float(run[case + "/x"], dtype) for run in runs]
        if pattern == "allreduce":
            ref = reference(inputs, None, None, dtype)
            check_close(as_float(got["allreduce_out"], dtype), ref["sum"], 2 * ref["sum_bound"],
                        case)
            continue
        from comm_worker import FP8_SCALE, HIDDEN, make  # what every rank used

        weight = as_float(make(99, 99, (HIDDEN,), dtype, 0.5, 1.5), dtype)
        ref = reference(inputs, as_float(runs[0][case + "/residual"], dtype), weight, dtype)
        check_close(as_float(got["residual_out"], dtype), ref["residual"],
                    2 * ref["residual_bound"], case + " residual_out")
        if "norm_out" in got:
            check_close(as_float(got["norm_out"], dtype), ref["norm"], 2 * ref["norm_bound"],
                        case + " norm_out")
        if "quant_out" in got:
            # e4m3 keeps 3 mantissa bits (half an ulp: 2^-4 relative) and
            # subnormals in steps of 2^-9.
            deq = e4m3_to_float(got["quant_out"]) * FP8_SCALE
            bound = 2 * ref["norm_bound"] + 2.0**-4 * np.abs(ref["norm"]) + 2.0**-10 * FP8_SCALE
            check_close(deq, ref["norm"], bound, case + " quant_out")
    return records[0]


@pytest.fixture(autouse=True)
def worker_imports():
    sys.path.insert(0, HERE)
    yield
    sys.path.remove(HERE)


@pytest.mark.parametrize("nproc", [2, 4])
def test_every_dtype_pattern_and_size_matches_the_reference_on_every_rank(
    arbiter_bin, tmp_path, nproc
):
    code, log = launch(arbiter_bin, tmp_path, nproc, "matrix")
    assert code == 0, log
    record = check_ranks(tmp_path, nproc)
    assert record["world_size"] == nproc
    # The decisions are the policy's: fused one-shot and two-shot below the
    # site table's 256 KiB, the unfused fallback above it.
    kinds = {tuple(v) for k, v in record.items() if k != "world_size"}
    assert ("shm", "oneshot", True) in kinds
    assert ("shm", "twoshot", True) in kinds
    assert ("shm", "native", False) in kinds
    with arbiter.load([tmp_path / "site.yaml"]) as policy:
        for key, value in record.items():
            if key == "world_size":
                continue
            backend, algorithm, fused = value
            dtype, pattern, tokens = key.split("-")
            if pattern in ("inplace", "dlpack", "replicated"):
                pattern = "residual_rmsnorm"
            d = policy.decide(capability="cpu", world_size=nproc, dtype=dtype, pattern=pattern,
                              tokens=int(tokens), hidden=512)
            assert (d.backend, d.algorithm, d.fused) == (backend, algorithm, fused), key


def test_the_callers_own_group_carries_the_bootstrap(arbiter_bin, tmp_path):
    code, log = launch(arbiter_bin, tmp_path, 2, "oob")
    assert code == 0, log
    check_ranks(tmp_path, 2)


def test_bad_calls_raise_before_anyone_waits(arbiter_bin, tmp_path):
    code, log = launch(arbiter_bin, tmp_path, 2, "bad")
    assert code == 0, log
    assert log.count("bad calls refused") == 2, log


def test_a_refusal_whose_peers_never_call_times_out_saying_both(arbiter_bin, tmp_path):
    code, log = launch(arbiter_bin, tmp_path, 2, "refuse_alone")
    assert code == 0, log
    assert "rank 1: TIMEOUT after" in log and "rank 0: made no call" in log, log


def test_registered_arrays_from_empty_give_the_same_bits_and_refuse_misuse(arbiter_bin,
                                                                            tmp_path):
    before = {n for n in os.listdir("/dev/shm") if n.startswith("arbiter-shm-")}
    code, log = launch(arbiter_bin, tmp_path, 2, "registered")
    assert code == 0, log
    assert log.count("registered: OK") == 2, log
    after = {n for n in os.listdir("/dev/shm") if n.startswith("arbiter-shm-")}
    assert after <= before, log


def test_a_call_refused_on_one_rank_is_refused_on_its_peers_and_the_next_is_in_step(
        arbiter_bin, tmp_path):
    code, log = launch(arbiter_bin, tmp_path, 2, "raise")
    assert code == 0, log
    for what in ("shape", "eps", "weight_bias", "scale"):
        assert f"rank 0: {what}: MISMATCH" in log and f"rank 1: {what}: INVALID_ARGUMENT" in log
    assert log.count("in step after the refusals") == 2, log


def test_ranks_with_different_tables_are_refused(arbiter_bin, tmp_path):
    code, log = launch(arbiter_bin, tmp_path, 2, "fingerprint", site=False)
    assert code == 0, log
    assert log.count("refused:") == 2, log


def test_the_tensor_parallel_example_matches_its_unsplit_model(arbiter_bin, tmp_path):
    program = [EXAMPLE, "--layers", "2", "--steps", "1", "--decode-tokens", "1", "8",
               "--prefill-tokens", "64"]
    code, log = launch(arbiter_bin, tmp_path, 2, None, site=False, program=program)
    assert code == 0, log
    assert "every layer shm oneshot fused" in log, log
    assert "every rank matches the unsplit model" in log, log


class BrokenGroup:
    def allgather(self, data: bytes) -> list[bytes]:
        raise RuntimeError("the group is gone")


class ShortGroup:
    def allgather(self, data: bytes) -> list[bytes]:
        return [data]  # one part for a group of two


@pytest.mark.parametrize(
    "group, fields, message",
    [
        (object(), {}, "has no allgather(bytes) -> list[bytes]"),
        (BrokenGroup(), {"rank": 2}, "need 0 <= rank < size"),
        (BrokenGroup(), {"hidden": 0}, "hidden 0 is not a positive integer"),
        (BrokenGroup(), {"max_tokens": -3}, "max_tokens -3 is not a positive integer"),
        (BrokenGroup(), {"timeout": float("inf")}, "timeout inf is not a positive number"),
        (BrokenGroup(), {"dtype": "int8"}, "int8"),
        (BrokenGroup(), {"capability": (9, 0)}, "a GPU rank needs its CUDA device ordinal"),
        (BrokenGroup(), {"capability": "9.0", "local_rank": -1}, "not a CUDA device ordinal"),
        (BrokenGroup(), {}, "oob allgather: RuntimeError: the group is gone"),
        (ShortGroup(), {}, "allgather returned 1 parts for a group of 2"),
    ],
)
def test_creation_fails_with_the_reason_and_waits_for_nobody(group, fields, message):
    kwargs = dict(rank=0, world_size=2, hidden=64, dtype="bf16", timeout=5)
    kwargs.update(fields)
    with pytest.raises(arbiter.ArbiterError) as e:
        arbiter.Communicator(group, **kwargs)
    assert message in e.value.message


class SoloGroup:
    """The group of a single rank (TP=1)."""

    def allgather(self, data: bytes) -> list[bytes]:
        return [data]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_one_rank_with_default_options_runs_the_norm(dtype):
    # Every option at its default: every pattern asked for, one CPU rank.
    with arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=64, dtype=dtype) as comm:
        assert comm.world_size == 1 and comm.backends == ["shm"]
        rng = np.random.default_rng(5)
        x, residual, weight = (rng.standard_normal(shape).astype(np.float32)
                               for shape in ((3, 64), (3, 64), (64,)))
        if dtype == "bf16":  # bf16 as its bits: the top half of each float32
            x, residual, weight = ((v.view(np.uint32) >> 16).astype(np.uint16)
                                   for v in (x, residual, weight))
        r = comm.allreduce_fusion(x, residual, weight, eps=1e-5)
        assert (r.decision.backend, r.decision.fused) == ("shm", False)
        ref = reference([as_float(x, dtype)], as_float(residual, dtype), as_float(weight, dtype),
                        dtype)
        for name in ("residual", "norm"):
            got = as_float(getattr(r, name + "_out"), dtype)
            assert np.all(np.abs(got - ref[name]) <= 2 * ref[name + "_bound"]), name


@pytest.mark.parametrize("timeout", [1e10, float(sys.maxsize), 2.0**63, 1e306])
def test_a_timeout_meant_as_never_waits_thirty_days_and_runs(timeout):
    # int(timeout * 1000) used to reach C as it came: 1e10 s overflowed the
    # library's clock (every wait ended at once) and sys.maxsize wrapped to
    # -1000 ms in the int64.
    with arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=64, dtype="fp32",
                              timeout=timeout) as comm:
        assert comm._options.timeout_ms == 30 * 24 * 3600 * 1000
        x = np.ones((2, 64), np.float32)
        r = comm.allreduce_fusion(x, np.ones_like(x), np.ones(64, np.float32))
        assert np.array_equal(r.residual_out, np.full_like(x, 2.0))


def test_an_fp8_scale_that_is_not_finite_and_positive_is_refused():
    # 0, a negative, NaN or inf quantised every element to a saturated or
    # NaN code, silently; the next good call runs.
    with arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=64, dtype="fp32") as comm:
        x = np.ones((2, 64), np.float32)
        w = np.ones(64, np.float32)
        for scale in (0.0, -1.0, float("nan"), float("inf")):
            with pytest.raises(arbiter.ArbiterError) as e:
                comm.allreduce_fusion(x, x.copy(), w, pattern="residual_rmsnorm_fp8", scale=scale)
            assert e.value.status == arbiter.Status.INVALID_ARGUMENT
            assert "must be finite and > 0" in e.value.message, e.value.message
        # Python's own failures are ArbiterErrors too: an int beyond any
        # float, and `out` as a list of pairs.
        for call in (
            lambda: comm.allreduce_fusion(x, x.copy(), w, pattern="residual_rmsnorm_fp8",
                                          scale=10**400),
            lambda: comm.allreduce_fusion(x, x.copy(), w, out=[("norm_out", np.empty_like(x))]),
        ):
            with pytest.raises(arbiter.ArbiterError) as e:
                call()
            assert e.value.status == arbiter.Status.INVALID_ARGUMENT, e.value.message
        r = comm.allreduce_fusion(x, x.copy(), w, pattern="residual_rmsnorm_fp8", scale=1.0)
        assert r.quant_out.shape == (2, 64)


def test_footprint_with_default_options_is_shm_private_memory():
    # One rank shares nothing: shm's workspace is private host memory, and
    # it takes a message of any size.
    with arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=64, dtype="bf16") as comm:
        figures = comm.footprint()
        assert list(figures) == ["shm"]
        shm = figures["shm"]
        assert shm.known and shm.device_bytes == 0 and shm.shared_bytes == 0
        assert shm.host_bytes > 0 and shm.host_bytes % 4096 == 0
        assert shm.total_bytes == shm.host_bytes
        assert shm.max_message_bytes == {"oneshot": None, "twoshot": None, "native": None}
        assert shm.note == ""
    with pytest.raises(arbiter.ArbiterError, match=r"footprint\(\): the communicator is closed"):
        comm.footprint()  # not the C API's bare "NULL argument"


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_first_block_runs_the_norm_without_a_residual(dtype):
    # residual=None with a weight: residual_rmsnorm of the sum alone, no zeros tensor.
    with arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=64, dtype=dtype) as comm:
        rng = np.random.default_rng(6)
        x, weight = (rng.standard_normal(shape).astype(np.float32) for shape in ((3, 64), (64,)))
        if dtype == "bf16":
            x, weight = ((v.view(np.uint32) >> 16).astype(np.uint16) for v in (x, weight))
        zeros = np.zeros_like(x)
        ref = reference([as_float(x, dtype)], as_float(zeros, dtype), as_float(weight, dtype),
                        dtype)
        r = comm.allreduce_fusion(x, None, weight, eps=1e-5)
        assert r.decision.backend == "shm"
        assert np.array_equal(r.residual_out, x)  # the sum (one rank: x), bit for bit
        got = as_float(r.norm_out, dtype)
        assert np.all(np.abs(got - ref["norm"]) <= 2 * ref["norm_bound"])
        # In place: residual_out over the input.
        y = x.copy()
        r2 = comm.allreduce_fusion(y, None, weight, eps=1e-5, out={"residual_out": y})
        assert np.array_equal(y, x) and np.array_equal(r2.norm_out, r.norm_out)
        with pytest.raises(arbiter.ArbiterError, match="pattern residual_rmsnorm needs weight"):
            comm.allreduce_fusion(x, None, None, pattern="residual_rmsnorm")


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_the_numpy_fast_path_gives_the_general_paths_bits(dtype, monkeypatch):
    # Plain numpy calls skip the per-array views (_numpy_call.py); the same
    # calls through memoryviews take the general path. Same bits, every
    # pattern the fast path takes, in place and not, and residual-free.
    from arbiter import _array_call

    rng = np.random.default_rng(11)
    kind = {"fp16": np.float16, "bf16": np.uint16, "fp32": np.float32}[dtype]

    def sample(shape):
        v = rng.standard_normal(shape).astype(np.float32)
        return (v.view(np.uint32) >> 16).astype(np.uint16) if dtype == "bf16" else v.astype(kind)

    x, residual, weight = sample((5, 64)), sample((5, 64)), sample((64,))
    with arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=64, dtype=dtype) as comm:
        general = _array_call._prepare
        taken = []
        monkeypatch.setattr(_array_call, "_prepare", lambda *a: taken.append(1) or general(*a))
        calls = [
            dict(args=(x,), outs=("allreduce_out",)),
            dict(args=(x, residual, weight), outs=("residual_out", "norm_out")),
            dict(args=(x, None, weight), outs=("residual_out", "norm_out")),
            dict(args=(x, residual, weight), kw=dict(eps=1e-2, weight_bias=1.0,
                                                      residual_replicated=True),
                 outs=("residual_out", "norm_out")),
        ]
        for c in calls:
            kw = c.get("kw", {})
            fast = comm.allreduce_fusion(*c["args"], **kw)
            assert not taken, "a plain numpy call took the general path"
            slow = comm.allreduce_fusion(*(None if a is None else memoryview(a)
                                           for a in c["args"]), **kw)
            assert taken, "memoryviews took the numpy path"
            taken.clear()
            for name in c["outs"]:
                got, want = getattr(fast, name), np.asarray(getattr(slow, name))
                assert got.dtype == want.dtype and np.array_equal(got.view(np.uint8),
                                                                  want.view(np.uint8)), name
            assert fast.decision == slow.decision
        # In place, outputs given: the fast path writes where it is told.
        y, r = x.copy(), residual.copy()
        comm.allreduce_fusion(y, r, weight, out={"norm_out": y, "residual_out": r})
        assert not taken
        want = comm.allreduce_fusion(memoryview(x), memoryview(residual), memoryview(weight))
        assert np.array_equal(y.view(np.uint8), want.norm_out.view(np.uint8))
        assert np.array_equal(r.view(np.uint8), want.residual_out.view(np.uint8))
        taken.clear()
        # What the fast path does not take goes to the general path, which
        # raises the error that names the rule.
        wrong = np.zeros((5, 64), np.float64)
        with pytest.raises(arbiter.ArbiterError, match="x: element type f64"):
            comm.allreduce_fusion(wrong)
        with pytest.raises(arbiter.ArbiterError, match="not C-contiguous"):
            comm.allreduce_fusion(np.zeros((64, 5), kind).T)
        readonly = x.copy()
        readonly.flags.writeable = False
        with pytest.raises(arbiter.ArbiterError, match="read-only"):
            comm.allreduce_fusion(x, residual, weight, out={"norm_out": readonly})
        with pytest.raises(arbiter.ArbiterError, match="must be True or False"):
            comm.allreduce_fusion(x, residual, weight, residual_replicated=1)
        assert len(taken) == 4
        # A read-only input is read in place all the same.
        assert np.array_equal(comm.allreduce_fusion(readonly).allreduce_out, x)


def test_a_pattern_no_backend_runs_is_refused_when_called():
    with arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=64, dtype="bf16") as comm:
        x = np.zeros((1, 64), dtype=np.uint16)
        with pytest.raises(arbiter.ArbiterError) as e:
            comm.allreduce_fusion(x, x, x[0], pattern="residual_rmsnorm_fp4", scale=1.0,
                                  out={"quant_out": np.zeros((1, 32), np.uint8),
                                       "scale_out": np.zeros(512, np.uint8)})
        assert e.value.status == arbiter.Status.UNSUPPORTED
        assert "no backend can run this residual_rmsnorm_fp4 (NVFP4) call" in e.value.message
        assert "shm: does not run residual_rmsnorm_fp4" in e.value.message


def test_patterns_narrow_what_the_communicator_runs():
    with arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=64, dtype="fp32",
                              patterns=["residual_rmsnorm"]) as comm:
        x = np.ones((2, 64), dtype=np.float32)
        comm.allreduce_fusion(x, x, x[0])
        with pytest.raises(arbiter.ArbiterError, match="created for residual_rmsnorm only"):
            comm.allreduce_fusion(x)
    for patterns, message in (([], "an empty list asks for nothing"),
                              (["rmsnorm"], "unknown pattern"),
                              (7, "is not a list of patterns")):
        with pytest.raises(arbiter.ArbiterError, match=message):
            arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=64, dtype="fp32",
                                 patterns=patterns)


def test_the_example_on_cuda_says_what_is_missing(arbiter_bin, tmp_path):
    # Without torch or a GPU: one clear line, no traceback. With both (a GPU
    # machine), the GPU run itself must pass.
    code, log = launch(arbiter_bin, tmp_path, 1, None, site=False,
                       program=[EXAMPLE, "--device", "cuda", "--layers", "1", "--steps", "1"])
    if code == 0:
        assert "every rank matches the unsplit model" in log, log
        return
    assert "Traceback" not in log, log
    assert ("--device cuda needs torch" in log or "torch sees no CUDA device" in log), log


def test_numpy_arrays_and_buffer_protocol_views_give_the_same_bits():
    """numpy arrays are read through their attributes; memoryviews (and
    array.array, ...) through the buffer protocol: the same call, the same bits."""
    with arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=64, dtype="fp16") as comm:
        rng = np.random.default_rng(9)
        x, residual = (rng.standard_normal((4, 64)).astype(np.float16) for _ in range(2))
        weight = np.ones(64, np.float16)
        weight.flags.writeable = False  # an input may be read-only
        by_numpy = comm.allreduce_fusion(x, residual, weight)
        outs = {"norm_out": np.empty_like(x), "residual_out": np.empty_like(x)}
        comm.allreduce_fusion(memoryview(x), memoryview(residual), memoryview(weight),
                              out={k: memoryview(v) for k, v in outs.items()})
        for name, got in outs.items():
            assert np.array_equal(got.view(np.uint16), getattr(by_numpy, name).view(np.uint16))
        readonly = np.zeros_like(x)
        readonly.flags.writeable = False
        with pytest.raises(arbiter.ArbiterError, match=r"norm_out'\]: the array is read-only"):
            comm.allreduce_fusion(x, residual, weight, out={"norm_out": readonly})


def test_empty_takes_numpy_integers_and_refuses_what_peers_cannot_read():
    # A shape of numpy integers (as a model's config often holds) works; an
    # object dtype would put this process's PyObject pointers where the
    # peers read them, so it is refused, as is a shape of floats.
    with arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=64, dtype="fp32") as comm:
        a = comm.empty((np.int64(4), np.uint16(64)))
        assert a.shape == (4, 64) and a.dtype == np.float32
        b = comm.empty(np.int32(8), dtype=np.int8)
        assert b.shape == (8,)
        with pytest.raises(arbiter.ArbiterError, match="holds pointers to Python objects"):
            comm.empty((4,), dtype=object)
        with pytest.raises(arbiter.ArbiterError, match=r"shape \(4.0, 64\) is not a tuple"):
            comm.empty((4.0, 64))
        with pytest.raises(arbiter.ArbiterError, match=r"shape \(True,\) is not a tuple"):
            comm.empty(True)
        with pytest.raises(arbiter.ArbiterError, match="is not a tuple of positive integers"):
            comm.empty(np.array(4))  # 0-d: has __iter__, cannot iterate
        # Byte counts size_t cannot hold wrapped around to 0 bytes (refused
        # as "0 bytes", a size nobody asked for) or to 16 bytes (allocated on
        # every rank, then numpy's own error).
        for shape in ((2**32, 2**32), (2**62 + 4,)):
            with pytest.raises(arbiter.ArbiterError, match=r"more than any allocation can hold"):
                comm.empty(shape)
        assert comm._registered == 2
        del a, b


def test_eps_may_be_a_numpy_float_and_anything_else_is_named():
    with arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=64, dtype="fp32") as comm:
        rng = np.random.default_rng(9)
        x, residual, weight = (rng.standard_normal(shape).astype(np.float32)
                               for shape in ((3, 64), (3, 64), (64,)))
        given = comm.allreduce_fusion(x.copy(), residual.copy(), weight, eps=np.float32(1e-5))
        same = comm.allreduce_fusion(x.copy(), residual.copy(), weight,
                                     eps=float(np.float32(1e-5)))
        assert np.array_equal(given.norm_out, same.norm_out)
        with pytest.raises(arbiter.ArbiterError,
                           match=r"eps must be a real number \(a Python or numpy float\), "
                                 r"not builtins.str"):
            comm.allreduce_fusion(x, residual, weight, eps="1e-5")
        with pytest.raises(arbiter.ArbiterError, match="weight_bias -inf must be finite"):
            comm.allreduce_fusion(x, residual, weight, weight_bias=np.float64("-inf"))


def test_abort_racing_close_never_touches_a_destroyed_communicator(arbiter_bin, tmp_path):
    code, log = launch(arbiter_bin, tmp_path, 2, "abort_close")
    assert code == 0, log
    assert log.count("abort/close: survived") == 2, log


def test_a_forked_child_cannot_join_with_its_parents_group(arbiter_bin, tmp_path):
    # Before, the child took its parent's group and mixed its messages into
    # the parent's connections: both timed out, or the child "joined".
    code, log = launch(arbiter_bin, tmp_path, 2, "fork_join", timeout=60)
    assert code == 0, log
    children = re.findall(r"fork/join: child of rank \d: ([\d.]+) s: (.*)", log)
    assert len(children) == 2, log
    for seconds, message in children:
        assert float(seconds) < 1.0, log
        assert "has since forked; this child can neither use that group nor join" in message, log
    assert log.count("fork/join: rank") == 2 and "ran on" in log, log


def test_a_forked_child_of_a_group_of_one_may_use_its_copy(arbiter_bin, tmp_path):
    # One rank has no connections to share with the parent.
    code, log = launch(arbiter_bin, tmp_path, 1, "fork_join", timeout=60)
    assert code == 0, log
    assert "fork/join: child of rank 0: the child joined and ran: 5.0" in log, log
    assert "fork/join: rank 0 ran on" in log, log


def test_a_forked_child_cannot_use_or_abort_its_parents_communicator():
    # Its calls would pair with the parent's peers; its abort() would stop
    # the parent's communicator through the shared memory.
    with arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=64, dtype="fp32") as comm:
        x = np.ones((2, 64), np.float32)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, then leave without cleanup
            try:
                comm.allreduce_fusion(x)
                message = "the call ran"
            except arbiter.ArbiterError as e:
                message = f"{e.status.name}: {e.message}"
            comm.abort()
            os.write(write, message.encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            child = pipe.read()
        os.waitpid(pid, 0)
        assert child.startswith("INVALID_ARGUMENT") and "has since forked" in child, child
        assert np.array_equal(comm.allreduce_fusion(x).allreduce_out, x)  # not aborted


def test_a_communicator_for_patterns_no_backend_runs_is_created_and_refuses_their_calls():
    # NVFP4 alone on CPU ranks: shm runs it not. As the docs promise for any
    # pattern no backend runs, creation goes on and the calls are refused
    # with the reason (creation failed, "the fallback backend shm is not usable").
    with arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=64, dtype="fp32",
                              patterns=["residual_rmsnorm_fp4"]) as comm:
        x = np.ones((2, 64), np.float32)
        with pytest.raises(arbiter.ArbiterError) as e:
            comm.allreduce_fusion(x, x.copy(), np.ones(64, np.float32),
                                  pattern="residual_rmsnorm_fp4", scale=1.0)
        assert e.value.status == arbiter.Status.UNSUPPORTED
        assert "no backend can run this residual_rmsnorm_fp4 (NVFP4) call" in e.value.message
        assert "shm: runs none of the patterns asked for" in e.value.message


def test_communicator_flags_and_copies():
    # nvlink_domain None (the default) is auto, as for Request: Policy.decide
    # and the communicator answer alike (the default was True, "one NVLink
    # domain", and None read as False).
    import copy

    with arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=64, dtype="bf16") as comm:
        assert comm._options.nvlink_domain == 0  # ARBITER_NVLINK_AUTO
        with pytest.raises(TypeError, match="cannot be copied"):
            copy.copy(comm)
    for flag, value, code in (("nvlink_domain", True, 1), ("nvlink_domain", False, 2)):
        with arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=64, dtype="bf16",
                                  **{flag: value}) as comm:
            assert comm._options.nvlink_domain == code
    for flag, value in (("nvlink_domain", "no"), ("multicast", "False")):
        with pytest.raises(arbiter.ArbiterError, match="is not"):
            arbiter.Communicator(SoloGroup(), rank=0, world_size=1, hidden=64, dtype="bf16",
                                 **{flag: value})
