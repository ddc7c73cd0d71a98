"""The Python binding decides as the C API, the C++ API and the `arbiter` program do."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import arbiter

KiB = 1 << 10
MiB = 1 << 20

DEFAULT_YAML = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "configs", "default.yaml"
)

# The default fusion caps (configs/default.yaml, vLLM at its ws=16 change),
# single node: (capability, world size) -> cap.
DEFAULT_FUSION_CAPS = {
    (90, 2): 64 * MiB,
    (90, 4): 2 * MiB,
    (90, 8): 512 * KiB,
    (100, 2): 64 * MiB,
    (100, 4): 32 * MiB,
    (100, 8): 1 * MiB,
    (103, 2): 64 * MiB,
    (103, 4): 64 * MiB,
    (103, 8): 2 * MiB,
    (107, 2): 64 * MiB,
    (107, 4): 64 * MiB,
    (107, 8): 2 * MiB,
    ("cpu", 2): 64 * MiB,
    ("cpu", 4): 64 * MiB,
    ("cpu", 8): 64 * MiB,
}

NVL72 = dict(capability="10.3", world_size=16, nodes=4, nvlink_domain=True, multicast=True)


@pytest.mark.parametrize("capability, world_size", sorted(DEFAULT_FUSION_CAPS, key=str))
def test_default_cell_is_fused_up_to_its_cap_inclusive(defaults, capability, world_size):
    cap = DEFAULT_FUSION_CAPS[(capability, world_size)]
    site = dict(capability=capability, world_size=world_size)
    fused_backend, fallback = ("shm", "shm") if capability == "cpu" else ("trtllm", "nccl")

    assert defaults.max_fused_bytes(**site) == cap
    at_cap = defaults.decide(message_bytes=cap, **site)
    assert (at_cap.backend, at_cap.fused, at_cap.reason, at_cap.cap) == (
        fused_backend,
        True,
        "fused",
        cap,
    )
    above = defaults.decide(message_bytes=cap + 1, **site)
    assert (above.backend, above.algorithm, above.fused, above.reason) == (
        fallback,
        "native",
        False,
        "above_cap",
    )


def test_one_shot_cells_pick_the_algorithm_of_trtllm(defaults):
    assert defaults.decide(capability=90, world_size=8, message_bytes="512KiB").algorithm == (
        "oneshot"
    )
    assert defaults.decide(capability=90, world_size=2, message_bytes=32 * MiB).algorithm == (
        "oneshot"
    )
    assert defaults.decide(capability=90, world_size=2, message_bytes=32 * MiB + 1).algorithm == (
        "twoshot"
    )


@pytest.mark.parametrize("capability", [100, 103, "sm_103", "sm103", "10.0"])
def test_ws16_on_an_nvl72_rack_runs_mnnvl_up_to_64_mib(defaults, capability):
    rack = dict(NVL72, capability=capability)
    assert defaults.max_fused_bytes(**rack) == 64 * MiB
    d = defaults.decide(message_bytes="64MiB", **rack)
    assert d == arbiter.Decision("mnnvl", "twoshot", True, "fused", 64 * MiB)
    d = defaults.decide(message_bytes=64 * MiB + 1, **rack)
    assert (d.backend, d.fused, d.reason) == ("nccl", False, "above_cap")


def test_ws16_without_multicast_falls_back_to_nccl(defaults):
    d = defaults.decide(message_bytes=MiB, **dict(NVL72, multicast=False))
    assert (d.backend, d.algorithm, d.fused, d.reason) == (
        "nccl",
        "native",
        False,
        "no_eligible_backend",
    )


@pytest.mark.parametrize("capability", [90, 107])
def test_ws16_without_a_fusion_cell_falls_back(defaults, capability):
    rack = dict(NVL72, capability=capability)
    assert defaults.max_fused_bytes(**rack) is None
    d = defaults.decide(message_bytes=MiB, **rack)
    assert (d.backend, d.fused, d.reason, d.cap) == ("nccl", False, "no_fusion_cell", None)
    assert "no fusion entry for capability" in defaults.explain(message_bytes=MiB, **rack)


def test_tokens_times_hidden_is_the_message_size(defaults):
    by_tokens = arbiter.Request(103, 8, tokens=256, hidden=4096, dtype="bf16")
    by_bytes = arbiter.Request(103, 8, message_bytes=256 * 4096 * 2)
    assert defaults.decide(by_tokens) == defaults.decide(by_bytes)
    assert defaults.decide(by_tokens) == defaults.decide(
        capability=103, world_size=8, tokens=256, hidden=4096
    )


def test_max_fused_bytes_splits_compile_ranges_at_whole_tokens(defaults):
    hidden, dtype = 4096, "bf16"
    cap = defaults.max_fused_bytes(capability=90, world_size=8, hidden=hidden, dtype=dtype)
    max_token_num = cap // (hidden * arbiter.element_size(dtype))
    assert max_token_num == 64
    site = dict(capability=90, world_size=8, hidden=hidden, dtype=dtype)
    assert defaults.decide(tokens=max_token_num, **site).fused
    assert not defaults.decide(tokens=max_token_num + 1, **site).fused


def test_site_file_overrides_one_cell_and_the_trace_names_it(site_file, defaults):
    with arbiter.load([site_file]) as site:
        assert site.max_fused_bytes(**NVL72) == 8 * MiB
        assert site.decide(message_bytes="8MiB", **NVL72).fused
        assert site.decide(message_bytes=8 * MiB + 1, **NVL72).reason == "above_cap"
        # Every other cell is still the default's.
        assert site.max_fused_bytes(capability=90, world_size=8) == 512 * KiB
        text = site.explain(message_bytes="8MiB", **NVL72)
        assert "site.yaml:4:5 (site)" in text
        assert "default.yaml" in text
        assert site.fingerprint != defaults.fingerprint


def test_a_replicated_residual_meets_the_cells_keyed_by_it(tmp_path):
    site = tmp_path / "replicated.yaml"
    site.write_text(
        "format: 1\n"
        "fusion:\n"
        "  - {capability: 90, world_size: 8, pattern: residual_rmsnorm, residual: replicated,"
        " max: 4MiB}\n"
        "oneshot:\n"
        "  cells:\n"
        "    - {capability: cpu, world_size: 2, residual: replicated, max: 2KiB}\n"
    )
    h200 = dict(capability=90, world_size=8, message_bytes="2MiB")
    with arbiter.load([str(site)]) as policy:
        assert not policy.decide(**h200).fused  # the default cell's 512 KiB
        replicated = policy.decide(residual_replicated=True, **h200)
        assert replicated.fused and replicated.cap == 4 * MiB
        assert policy.max_fused_bytes(residual_replicated=True, **h200) == 4 * MiB
        assert json.loads(policy.explain(residual_replicated=True, json=True, **h200))[
            "request"
        ]["residual_replicated"] is True
        assert "residual replicated" in policy.explain(residual_replicated=True, **h200)
        # No residual in a plain all-reduce: the flag changes nothing.
        assert not policy.decide(residual_replicated=True, pattern="allreduce", **h200).fused
        cpu = dict(capability="cpu", world_size=2, message_bytes="4KiB")
        assert policy.decide(**cpu).algorithm == "oneshot"
        assert policy.decide(residual_replicated=True, **cpu).algorithm == "twoshot"
        with pytest.raises(arbiter.ArbiterError, match="residual_replicated 1 is not a bool"):
            policy.decide(residual_replicated=1, **cpu)


def test_registered_buffers_meet_the_cells_keyed_by_them(tmp_path):
    # At 2 CPU ranks a registered residual_rmsnorm call runs one-shot to
    # 512 KiB here, and is fused to 32 MiB.
    site = tmp_path / "registered.yaml"
    site.write_text(
        "format: 1\n"
        "fusion:\n"
        "  - {capability: cpu, world_size: 2, pattern: residual_rmsnorm, residual: distinct,"
        " buffers: registered, max: 32MiB}\n"
        "oneshot:\n"
        "  cells:\n"
        "    - {capability: cpu, world_size: 2, pattern: residual_rmsnorm, residual: distinct,"
        " buffers: registered, max: 512KiB}\n"
    )
    cpu = dict(capability="cpu", world_size=2, message_bytes="256KiB")
    with arbiter.load([str(site)]) as policy:
        assert policy.decide(**cpu).algorithm == "twoshot"  # shm's 256 KiB total
        assert policy.decide(buffers_registered=True, **cpu).algorithm == "oneshot"
        assert policy.max_fused_bytes(**cpu) == 64 * MiB
        assert policy.max_fused_bytes(buffers_registered=True, **cpu) == 32 * MiB
        explained = json.loads(policy.explain(buffers_registered=True, json=True, **cpu))
        assert explained["request"]["buffers_registered"] is True
        assert "registered.yaml:6:7" in policy.explain(buffers_registered=True, **cpu)
        with pytest.raises(arbiter.ArbiterError, match="buffers_registered 1 is not a bool"):
            policy.decide(buffers_registered=1, **cpu)
        # A Request with fields changed, as operators.md writes it.
        request = arbiter.Request(**cpu)
        assert policy.decide(request, buffers_registered=True).algorithm == "oneshot"
        assert policy.decide(request).algorithm == "twoshot"
        with pytest.raises(TypeError, match="expected an arbiter.Request"):
            policy.decide(cpu, buffers_registered=True)


def test_arbiter_config_reaches_from_environment(site_file, monkeypatch):
    monkeypatch.setenv("ARBITER_CONFIG", str(site_file))
    with arbiter.from_environment() as env, arbiter.load([site_file]) as explicit:
        assert env.fingerprint == explicit.fingerprint
        assert env.max_fused_bytes(**NVL72) == 8 * MiB


def test_backends_restriction(monkeypatch):
    only_nccl = arbiter.load(backends="nccl")
    d = only_nccl.decide(capability=90, world_size=8, message_bytes=KiB)
    assert (d.backend, d.fused, d.reason) == ("nccl", False, "no_eligible_backend")
    monkeypatch.setenv("ARBITER_BACKENDS", "nccl")
    assert arbiter.from_environment().fingerprint == only_nccl.fingerprint
    with pytest.raises(arbiter.ArbiterError, match=r"unknown backend 'frob'"):
        arbiter.load(backends="frob")
    # A list of names reads as their comma list.
    assert arbiter.load(backends=["nccl"]).fingerprint == only_nccl.fingerprint
    assert (arbiter.load(backends=("shm", "nccl")).fingerprint ==
            arbiter.load(backends="shm,nccl").fingerprint)


def test_bad_yaml_raises_with_file_line_and_column(tmp_path, site_file):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "format: 1\n"
        "fusion:\n"
        "  - {capability: 103, world_size: 8, max: 2MiB}\n"
        "  - {capability: 103, world_size: 4, max: 12 MB}\n"
    )
    with pytest.raises(arbiter.ArbiterError) as raised:
        arbiter.load([site_file, bad])  # all or nothing: the good file does not load alone
    error = raised.value
    assert error.status == arbiter.Status.INVALID_ARGUMENT
    assert str(error) == error.message
    assert error.message.startswith(f"{bad}:4:43: error: unknown size unit 'MB'")
    assert "sizes are binary" in error.message


def test_bad_yaml_message_is_what_the_cli_prints(tmp_path, arbiter_bin):
    bad = tmp_path / "dup.yaml"
    bad.write_text("format: 1\nfallback:\n  gpu: nccl\nfallback:\n  cpu: shm\n")
    with pytest.raises(arbiter.ArbiterError) as raised:
        arbiter.load([bad])
    cli = subprocess.run([arbiter_bin, "validate", str(bad)], capture_output=True, text=True)
    assert cli.returncode == 1
    assert raised.value.message.startswith(f"{bad}:4:1: error:")
    assert raised.value.message.strip() in (cli.stdout + cli.stderr)


def test_missing_file_is_an_error():
    with pytest.raises(arbiter.ArbiterError, match="cannot open the file"):
        arbiter.load(["/nonexistent/site.yaml"])


def test_explain_json_parses_and_matches_decide(defaults):
    d = defaults.decide(message_bytes="64MiB", **NVL72)
    doc = json.loads(defaults.explain(message_bytes="64MiB", json=True, **NVL72))
    assert (doc["backend"], doc["algorithm"], doc["fused"], doc["reason"]) == (
        d.backend,
        d.algorithm,
        d.fused,
        d.reason,
    )
    assert doc["cap"] == d.cap == doc["max_fused_bytes"] == 64 * MiB
    assert doc["fingerprint"] == defaults.fingerprint_hex
    assert doc["request"]["world_size"] == 16
    assert any(
        step["origin"] and step["origin"]["file"].endswith("default.yaml") for step in doc["trace"]
    )


def test_explain_text_starts_with_the_decision(defaults):
    text = defaults.explain(message_bytes="64MiB", **NVL72)
    assert text.startswith("decision: mnnvl twoshot fused (cap 64 MiB)")


def test_fingerprint_depends_on_the_tables_only(tmp_path, site_file, defaults):
    again = arbiter.load()
    assert again.fingerprint == defaults.fingerprint
    assert again.fingerprint_hex == f"{defaults.fingerprint:016x}"
    copy = tmp_path / "copy.yaml"
    copy.write_text(site_file.read_text())
    assert arbiter.load([copy]).fingerprint == arbiter.load([site_file]).fingerprint
    assert arbiter.load([copy]).fingerprint != defaults.fingerprint


def test_site_files_that_leave_settings_out_load_over_the_defaults(tmp_path, defaults):
    # No `enabled:` and no fallback: the table that once crashed the loader.
    five_lines = tmp_path / "t.yaml"
    five_lines.write_text(
        "format: 1\npreference:\n  single_node: [trtllm]\nbackends:\n  trtllm: {device: gpu}\n"
    )
    with arbiter.load([five_lines]) as policy:
        d = policy.decide(capability=90, world_size=8, multicast=True, message_bytes=256 << 10)
        assert (d.backend, d.fused) == ("trtllm", True)
    # The default with `enabled:` deleted, as a site file, changes nothing.
    no_enabled = tmp_path / "no-enabled.yaml"
    with open(DEFAULT_YAML) as f:
        text = f.read()
    no_enabled.write_text("".join(l for l in text.splitlines(True) if not l.startswith("enabled:")))
    with arbiter.load([no_enabled]) as policy:
        assert policy.fingerprint == defaults.fingerprint


def test_every_consumer_agrees_with_the_cli(site_file, monkeypatch, arbiter_bin):
    monkeypatch.setenv("ARBITER_CONFIG", str(site_file))
    policy = arbiter.from_environment()
    args = ["decide", "--capability", "103", "--world-size", "16", "--nodes", "4"]
    args += ["--nvlink-domain", "--multicast", "--bytes", "8MiB", "--json"]
    cli = json.loads(
        subprocess.run([arbiter_bin, *args], capture_output=True, text=True, check=True).stdout
    )
    ours = json.loads(policy.explain(message_bytes="8MiB", json=True, **NVL72))
    assert cli["fingerprint"] == policy.fingerprint_hex
    assert cli == ours


def test_sizes_are_exact_integers():
    assert arbiter.parse_size("0.5MiB") == 524288
    assert arbiter.parse_size("64 MiB") == 64 * MiB
    assert arbiter.parse_size(4096) == 4096
    for bad in (524288.0, "1.5B", "12 MB", 0, "-1", True):
        with pytest.raises(arbiter.ArbiterError):
            arbiter.parse_size(bad)


def test_a_bare_fraction_is_refused_with_what_it_meant(defaults):
    # In the tables a bare number is MiB; here it is bytes. A table value
    # pasted here is neither half a byte nor silently MiB: the error says both.
    for bad in (0.5, "0.5", " 0.5 "):
        with pytest.raises(arbiter.ArbiterError) as e:
            arbiter.parse_size(bad)
        assert "0.5 what? in the tables a bare number is MiB" in str(e.value)
        assert "write '0.5MiB' or 524288" in str(e.value)
        assert e.value.status == arbiter.Status.INVALID_ARGUMENT
    with pytest.raises(arbiter.ArbiterError, match="0.5 what"):
        defaults.decide(capability=90, world_size=8, message_bytes="0.5")
    with pytest.raises(arbiter.ArbiterError, match="write 524288 "):
        arbiter.parse_size(524288.0)
    assert arbiter.parse_size("524288") == arbiter.parse_size("0.5MiB") == 524288


def test_capability_spellings():
    for spelling in (103, "103", "10.3", "sm_103", "sm103"):
        assert arbiter.parse_capability(spelling) == 103
    assert arbiter.parse_capability("cpu") == 0
    for bad in ("sm_90a", "9", "10.30", "h100", 9.0):
        with pytest.raises(arbiter.ArbiterError) as raised:
            arbiter.parse_capability(bad)
        assert raised.value.status == arbiter.Status.INVALID_ARGUMENT
    with pytest.raises(arbiter.ArbiterError, match="did you mean 90"):
        arbiter.parse_capability("9")


def test_unknown_names_are_errors_not_defaults(defaults):
    with pytest.raises(arbiter.ArbiterError, match="unknown dtype 'bf61'"):
        defaults.decide(capability=90, world_size=8, message_bytes=KiB, dtype="bf61")
    with pytest.raises(arbiter.ArbiterError, match="unknown pattern"):
        defaults.decide(capability=90, world_size=8, message_bytes=KiB, pattern="rmsnorm")


def test_an_impossible_request_is_a_decision_not_an_exception(defaults):
    d = defaults.decide(capability=90, world_size=2, nodes=3, message_bytes=KiB)
    assert (d.backend, d.fused, d.reason) == ("nccl", False, "invalid_request")


def test_a_single_rank_goes_to_the_fallback(defaults):
    # TP=1 runs through the same code: no cell fuses one rank.
    for capability, backend in ((90, "nccl"), ("cpu", "shm")):
        d = defaults.decide(capability=capability, world_size=1, message_bytes=KiB)
        assert (d.backend, d.fused, d.reason) == (backend, False, "no_fusion_cell")


def test_a_closed_policy_refuses_calls():
    policy = arbiter.load()
    policy.close()
    with pytest.raises(arbiter.ArbiterError, match="closed"):
        policy.decide(capability=90, world_size=8, message_bytes=KiB)


def test_the_library_comes_from_arbiter_library_when_set():
    explicit = os.environ.get("ARBITER_LIBRARY")
    if not explicit:
        pytest.skip("ARBITER_LIBRARY is not set")
    loaded = os.path.realpath(arbiter.library_path())
    assert loaded.startswith(os.path.realpath(explicit).rstrip("/"))


def test_arbiter_library_naming_another_library_is_an_arbiter_error():
    # A library that loads but is not arbiter's runtime (libm here; in the
    # field the policy library or a module beside it) raised a bare
    # AttributeError naming a symbol, not the variable or the fix.
    import subprocess
    import sys

    probe = ("import arbiter\n"
             "try:\n"
             "    arbiter.library_path()\n"
             "except arbiter.ArbiterError as e:\n"
             "    print('ArbiterError', e.message)\n")
    env = dict(os.environ, ARBITER_LIBRARY="libm.so.6")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ArbiterError ARBITER_LIBRARY=libm.so.6: not "
                                 "libarbiter_runtime.so"), out.stdout
    assert "give the path of libarbiter_runtime.so or of its folder" in out.stdout


def test_a_decision_needs_the_size_of_the_call(defaults):
    # Without message_bytes, or tokens and hidden, the request was decided
    # for 0 bytes: fused, whatever the real size (the CLI asks for the size).
    for fields in ({}, {"hidden": 8192}, {"tokens": 100}):
        for call in (defaults.decide, defaults.explain):
            with pytest.raises(arbiter.ArbiterError, match="give the message size"):
                call(capability=90, world_size=8, **fields)
    assert defaults.decide(capability=90, world_size=8, tokens=1, hidden=8192).fused
    # max_fused_bytes ignores the size, as documented.
    assert defaults.max_fused_bytes(capability=90, world_size=8) == 512 * KiB


def test_flags_and_capabilities_are_read_strictly(defaults):
    site = dict(capability=103, world_size=8, message_bytes=1)
    for bad in (dict(nvlink_domain="false"), dict(multicast="False"), dict(multicast=1)):
        with pytest.raises(arbiter.ArbiterError, match="is not"):
            defaults.decide(**dict(site, **bad))
    # Only ASCII digits: the CLI refuses "١٠٣" too.
    for text in ("١٠٣", "٩.٠"):
        with pytest.raises(arbiter.ArbiterError, match="unknown capability"):
            arbiter.parse_capability(text)
    with pytest.raises(arbiter.ArbiterError, match="is not a number"):
        arbiter.parse_size("١٠٢٤")
    # torch.cuda.get_device_capability()'s tuple, as the Communicator takes it.
    assert defaults.decide(capability=(10, 3), world_size=8, message_bytes=1) == \
        defaults.decide(capability=103, world_size=8, message_bytes=1)
    for bad in ((10,), (10, 30), ("10", "3"), (0, 9)):
        with pytest.raises(arbiter.ArbiterError, match="a tuple must be"):
            arbiter.parse_capability(bad)


def test_paths_and_backends_are_passed_whole(tmp_path):
    site = tmp_path / "cap.yaml"
    site.write_text("format: 1\n")
    # C would read the path up to the NUL: another file, silently.
    with pytest.raises(arbiter.ArbiterError, match="NUL"):
        arbiter.Policy.load([str(site) + "\0junk"])
    with pytest.raises(arbiter.ArbiterError, match="NUL"):
        arbiter.Policy.load(backends="shm\0,bogus")
    # "" reads as ARBITER_BACKENDS="" does: unrestricted.
    with arbiter.Policy.load(backends="") as p, arbiter.Policy.load() as q:
        assert p.fingerprint == q.fingerprint
    # A site file whose path is not UTF-8: the explanation says it, replaced.
    odd = os.path.join(os.fsencode(tmp_path), b"\xff.yaml")
    with open(odd, "w") as f:
        f.write("format: 1\nfusion:\n  - {capability: 107, world_size: 8, max: 1KiB}\n")
    with arbiter.Policy.load([odd]) as p:
        assert "\ufffd.yaml" in p.explain(capability=107, world_size=8, message_bytes=1)


def test_policies_and_communicators_are_not_copied():
    # A copy shared the handle: closing the original left it dangling, and
    # the copy's next call crashed the process.
    import copy
    import pickle

    with arbiter.Policy.load() as p:
        for make in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError, match="cannot be copied"):
                make(p)


def test_closing_a_policy_while_threads_decide_is_safe():
    # close() waited on nothing: a decision in another thread read freed
    # tables (a segfault within 200 tries). In a child, so a crash is a
    # failure rather than the end of the test run.
    script = """
import threading, arbiter
for trial in range(60):
    p = arbiter.Policy.load()
    stop = False
    def work():
        while not stop:
            try:
                p.explain(capability=103, world_size=8, message_bytes=1, json=True)
            except arbiter.ArbiterError as e:
                assert "closed" in e.message, e.message
    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads: t.start()
    p.close()
    stop = True
    for t in threads: t.join()
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
