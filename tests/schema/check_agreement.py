#!/usr/bin/env python3
"""The JSON Schema and the C++ validator agree on every table.

Runs both over the table corpus (tests/data/{good,warn,bad}, configs/default.yaml,
tests/schema/cases/{good,bad}) and over a matrix of scalar spellings (sizes,
capabilities, booleans, world sizes, provenance values), and fails on any
file where one accepts and the other rejects, unless the file is on the
allow-list below: rules FORMAT.md says the schema cannot express (they span
fields or files, or depend on how a value is spelled rather than what it is).
An allow-list entry that no longer disagrees fails too, so the list stays
exact.

Schema side: the file is read as YAML 1.2 (core schema), as
yaml-language-server reads it. PyYAML implements YAML 1.1, where a bare
`off`, `yes` or `on` is a boolean and 2025-01-01 a timestamp, so its implicit
types are replaced here by the YAML 1.2 core schema's; duplicate keys, which
YAML 1.2 forbids and PyYAML silently merges, are load errors. A file that
does not load is rejected. Validated with Draft 2020-12, and with Draft 7,
whose verdicts must match (the schema promises draft-07 editors the same
checks).

C++ side: `arbiter validate FILE` (exit 0 valid, 1 invalid; anything else
fails the test), `--standalone` for configs/default.yaml.

usage: check_agreement.py --arbiter BIN --schema FILE --data DIR --cases DIR --default FILE
"""

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile

try:
    import jsonschema
    import yaml
except ImportError as e:  # pragma: no cover
    sys.exit("schema agreement: %s; install python3-yaml and python3-jsonschema "
             "(scripts/setup.sh does)" % e)

import json

# --- allow-list -------------------------------------------------------------
# File (relative to the repository's tests/ folder) -> why the schema accepts
# what the C++ validator rejects. Only rules FORMAT.md lists as beyond the
# schema ("cannot check the rules that span fields or files ...") or that
# depend on the spelling of a scalar, which JSON Schema never sees.
ALLOWED = {
    # Cross-field rules (FORMAT.md, "Editor support").
    "data/bad/nodes_above_world_size.yaml":
        "cross-field: a cell's nodes <= its world_size",
    "data/bad/world_sizes_min_above_max.yaml":
        "cross-field: world_sizes min <= max",
    "data/bad/duplicate_cell.yaml":
        "cross-item: two cells with identical keys in one file",
    "data/bad/conflicting_cells_equal_specificity.yaml":
        "cross-item: two equally specific cells that one call matches, with different caps",
    # Cross-file rules: the backend's device and the threshold come from the
    # layer below (the embedded default), which the schema never sees.
    "data/bad/cpu_backend_in_single_node_preference.yaml":
        "cross-file: shm is a cpu backend by the default's backends.shm.device",
    "data/bad/fallback_gpu_is_cpu_backend.yaml":
        "cross-file: shm is a cpu backend by the default's backends.shm.device",
    "data/bad/threshold_without_oneshot_max_total.yaml":
        "cross-file: no layer sets oneshot_max_total for an algorithm: threshold backend",
    # Size strings: FORMAT.md, "whole bytes and the 1 TiB limit for size strings".
    "data/bad/size_above_1tib.yaml":
        "size string above 1 TiB (the limit is checked only for numbers)",
    # YAML-level rules, like anchors: tags are part of YAML, not of the value
    # the schema sees ('!!str 2MiB' is the string '2MiB', a valid size).
    "data/bad/yaml_tag.yaml":
        "YAML tag: the schema sees the tagged value, a valid size",
    # Spellings (generated matrix below): JSON Schema sees the value a YAML
    # 1.2 loader produced, never how it was written.
    "matrix/size-plain-1e3.yaml":
        "spelling: 1e3 is the YAML 1.2 float 1000; the validator rejects exponents",
    "matrix/size-plain-0x40.yaml":
        "spelling: 0x40 is the YAML 1.2 integer 64; the validator reads decimal only",
    "matrix/size-plain-0o100.yaml":
        "spelling: 0o100 is the YAML 1.2 integer 64; the validator reads decimal only",
    "matrix/size-quoted-2TiB.yaml":
        "size string above 1 TiB (the limit is checked only for numbers)",
    "matrix/size-quoted-1.5B.yaml":
        "size string that is not a whole number of bytes (checked only for numbers)",
    "matrix/size-plain-1.5B.yaml":
        "size string that is not a whole number of bytes (checked only for numbers)",
    "matrix/bool-plain-True.yaml":
        "spelling: True is a YAML 1.2 boolean; tables write only true and false",
    "matrix/bool-plain-FALSE.yaml":
        "spelling: FALSE is a YAML 1.2 boolean; tables write only true and false",
    "matrix/world_size-plain-8.0.yaml":
        "spelling: 8.0 is an integer to JSON Schema; the validator wants digits",
    "matrix/world_size-plain-+8.yaml":
        "spelling: +8 is the YAML 1.2 integer 8; the validator wants digits",
    "matrix/world_size-plain-0x8.yaml":
        "spelling: 0x8 is the YAML 1.2 integer 8; the validator reads decimal only",
}

# --- the spelling matrix ----------------------------------------------------
# (group, template with {v}, [(spelling, expected: True valid / False invalid)])
# `expected` is the validator's verdict (the authority); the schema must agree
# unless allow-listed.
MATRIX = [
    ("size", "format: 1\nfusion:\n  - {{capability: 103, world_size: 8, max: {v}}}\n", [
        ("64", True), ("0.5", True), ("1.5", True), ("+64", True), (".5", True), ("64.", True),
        ("1048576", True), ("1048577", False), ("0.00000095367431640625", True),
        ("0.3", False), ("0", False), ("-2", False), (".inf", False), (".nan", False),
        ("1e3", False), ("0x40", False), ("0o100", False),
        ("64MiB", True), ("64 MiB", True), ("512KiB", True), ("4096B", True), ("1.5MiB", True),
        ("1TiB", True), ("1.5B", False), ("64MB", False), ("64mib", False), ("64 parsecs", False),
        ("off", True), ("Off", False), ("false", False), ("~", False), ("[64]", False),
        ('"64"', False), ("'0.5'", False), ('"524288"', False), ('"64MiB"', True),
        ('"64 MiB"', True), ('"64  MiB"', False), ('"+64MiB"', True), ('".5MiB"', True),
        ('"64.MiB"', True), ('" 64MiB "', True), ('"2TiB"', False), ('"1.5B"', False),
        ('"off"', True), ('"0MiB"', False), ('"64MB"', False), ('""', False),
    ]),
    ("capability", "format: 1\nfusion:\n  - {{capability: {v}, world_size: 8, max: 2}}\n", [
        ("103", True), ("90", True), ("50", True), ("199", True), ("49", False), ("200", False),
        ("9", False), ('"103"', True), ('"10.3"', True), ("10.3", False), ("sm_103", True),
        ("sm103", True), ('"sm_90"', True), ("sm_90a", False), ("sm_10.3", False),
        ("cpu", True), ('"cpu"', True), ("CPU", False), ("ten", False), ('"9.0"', True),
        ("true", False),
    ]),
    ("bool", "format: 1\nbackends:\n  trtllm:\n    needs_nvlink: {v}\n", [
        ("true", True), ("false", True), ("True", False), ("FALSE", False), ("yes", False),
        ("on", False), ("off", False), ('"true"', False), ("1", False), ("~", False),
    ]),
    ("world_size", "format: 1\nfusion:\n  - {{capability: 103, world_size: {v}, max: 2}}\n", [
        ("8", True), ("2", True), ("1024", True), ("1", False), ("1025", False), ('"8"', False),
        ("8.0", False), ("+8", False), ("0x8", False), ("010", True), ("eight", False),
    ]),
    ("provenance", "format: 1\nprovenance:\n  notes: {v}\n", [
        ("measured by hand", True), ('"quoted"', True), ("2025-01-01", True), ("4", True),
        ("2.21", True), ("yes", True), ("true", True), ("~", False), ("[a, b]", False),
        ("{a: b}", False),
    ]),
    ("enabled", "format: 1\nenabled: {v}\n", [
        ("[trtllm, nccl]", True), ("[nccl, nccl]", False), ("[trtlm]", False), ("nccl", False),
    ]),
]


# --- YAML 1.2 core schema on PyYAML -----------------------------------------
class Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with the YAML 1.2 core schema's implicit types."""


Yaml12Loader.yaml_implicit_resolvers = {}
_CORE = [
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    ("tag:yaml.org,2002:float",
     r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
     r"|[-+]?\.(?:inf|Inf|INF)|\.nan|\.NaN|\.NAN)$", "-+.0123456789"),
]
for _tag, _regex, _first in _CORE:
    Yaml12Loader.add_implicit_resolver(_tag, re.compile(_regex), list(_first))


def _construct_bool(loader, node):
    return loader.construct_scalar(node).lower() == "true"


def _construct_int(loader, node):
    value = loader.construct_scalar(node)
    if value.startswith("0o"):
        return int(value[2:], 8)
    if value.startswith("0x"):
        return int(value[2:], 16)
    return int(value, 10)  # 1.2: a leading 0 is not octal


def _construct_float(loader, node):
    value = loader.construct_scalar(node).lower()
    if value.endswith(".inf"):
        return -math.inf if value.startswith("-") else math.inf
    if value == ".nan":
        return math.nan
    return float(value)


def _construct_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, (str, int, float, bool)) and key is not None:
            raise yaml.constructor.ConstructorError(None, None, "unhashable key",
                                                    key_node.start_mark)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, "duplicate key %r (YAML 1.2 forbids it)" % (key,),
                key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


Yaml12Loader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)
Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
Yaml12Loader.add_constructor("tag:yaml.org,2002:float", _construct_float)
Yaml12Loader.construct_mapping = _construct_mapping


# Loaders that editors use refuse documents whose aliases expand without bound
# (yaml-language-server's `yaml` package: "Excessive alias count"). So does
# this one: checking an expanded billion-laughs document would take minutes.
MAX_EXPANDED_NODES = 100000


def expanded_size(node, memo, open_nodes):
    key = id(node)
    if key in memo:
        return memo[key]
    if key in open_nodes:
        raise yaml.YAMLError("an alias refers to a node that contains it (cyclic document)")
    open_nodes.add(key)
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(expanded_size(n, memo, open_nodes) for n in node.value)
    elif isinstance(node, yaml.MappingNode):
        size += sum(expanded_size(k, memo, open_nodes) + expanded_size(v, memo, open_nodes)
                    for k, v in node.value)
    open_nodes.discard(key)
    if size > MAX_EXPANDED_NODES:
        raise yaml.YAMLError("aliases expand to more than %d nodes" % MAX_EXPANDED_NODES)
    memo[key] = size
    return size


def load_yaml12(path):
    with open(path, "rb") as f:
        data = f.read()  # bytes: PyYAML checks the encoding
    root = yaml.compose(data, Loader=Yaml12Loader)
    if root is not None:
        expanded_size(root, {}, set())
    return yaml.load(data, Loader=Yaml12Loader)


# --- the two verdicts --------------------------------------------------------
class Verdict:
    def __init__(self, ok, detail):
        self.ok = ok
        self.detail = detail


def schema_verdict(validators, path):
    try:
        document = load_yaml12(path)
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as e:
        return Verdict(False, "not YAML 1.2: " + str(e).replace("\n", " ")[:160])
    verdicts = []
    for validator in validators:
        try:
            errors = sorted(validator.iter_errors(document), key=lambda e: list(e.path))
        except RecursionError:
            return Verdict(False, "schema check recursed without end (cyclic document)")
        first = ""
        if errors:
            where = "/".join(str(p) for p in errors[0].path) or "(root)"
            first = "%s: %s" % (where, errors[0].message[:160])
        verdicts.append((not errors, first))
    if len({ok for ok, _ in verdicts}) != 1:
        raise SystemExit("%s: Draft 2020-12 and Draft 7 disagree (%s): the schema uses a "
                         "keyword draft-07 editors do not read" % (path, verdicts))
    ok, first = verdicts[0]
    return Verdict(ok, "valid" if ok else first)


def cpp_verdict(arbiter, path, standalone):
    env = dict(os.environ)
    env.pop("ARBITER_CONFIG", None)
    env.pop("ARBITER_BACKENDS", None)
    args = [arbiter, "validate"] + (["--standalone"] if standalone else []) + [path]
    try:
        run = subprocess.run(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             timeout=60)
    except subprocess.TimeoutExpired:
        raise SystemExit("%s: arbiter validate hung (60 s)" % path)
    output = run.stdout.decode("utf-8", "replace")
    if run.returncode not in (0, 1):
        raise SystemExit("%s: arbiter validate exited %d (expected 0 or 1):\n%s" %
                         (path, run.returncode, output))
    first_error = next((l for l in output.splitlines() if ": error: " in l), "")
    return Verdict(run.returncode == 0, "valid" if run.returncode == 0 else first_error[:200])


# --- the corpus ---------------------------------------------------------------
class Case:
    def __init__(self, name, path, expected=None, standalone=False):
        self.name = name          # key for ALLOWED
        self.path = path
        self.expected = expected  # True / False / None (no folder expectation)
        self.standalone = standalone


def corpus(args, workdir):
    cases = []
    tests_dir = os.path.dirname(os.path.abspath(args.data))
    for root, expected in ((args.data, None), (args.cases, None)):
        for sub, want in (("good", True), ("warn", True), ("bad", False)):
            folder = os.path.join(root, sub)
            if not os.path.isdir(folder):
                continue
            for name in sorted(os.listdir(folder)):
                path = os.path.join(folder, name)
                if os.path.isfile(path) and name.endswith(".yaml"):
                    rel = os.path.relpath(path, tests_dir).replace(os.sep, "/")
                    cases.append(Case(rel, path, want))
    cases.append(Case("configs/default.yaml", args.default, True, standalone=True))
    for group, template, spellings in MATRIX:
        for spelling, expected in spellings:
            kind = "quoted" if spelling[:1] in "\"'" else "plain"
            label = spelling[1:-1] if kind == "quoted" else spelling
            label = "".join(c if re.match(r"[A-Za-z0-9.+-]", c) else "_" if c == " " else
                            "%02x" % ord(c) for c in label) or "empty"
            name = "matrix/%s-%s-%s.yaml" % (group, kind, label)
            path = os.path.join(workdir, name.replace("/", "_"))
            with open(path, "w") as f:
                f.write("# %s: %s\n" % (group, spelling) + template.format(v=spelling))
            cases.append(Case(name, path, expected))
    names = [c.name for c in cases]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise SystemExit("two cases share a name: %s" % sorted(dupes))
    return cases


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arbiter", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--data", required=True, help="tests/data")
    parser.add_argument("--cases", required=True, help="tests/schema/cases")
    parser.add_argument("--default", required=True, help="configs/default.yaml")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()

    with open(args.schema) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    validators = [jsonschema.Draft202012Validator(schema), jsonschema.Draft7Validator(schema)]

    failures = []
    counts = {"agree": 0, "allowed": 0}
    with tempfile.TemporaryDirectory(prefix="arbiter-schema-") as workdir:
        cases = corpus(args, workdir)
        names = {c.name for c in cases}
        for stale in sorted(set(ALLOWED) - names):
            failures.append("%s: on the allow-list but not in the corpus" % stale)
        for case in cases:
            cpp = cpp_verdict(args.arbiter, case.path, case.standalone)
            sch = schema_verdict(validators, case.path)
            if args.verbose:
                print("%-60s c++ %-7s schema %-7s" % (case.name, "valid" if cpp.ok else "invalid",
                                                       "valid" if sch.ok else "invalid"))
            if case.expected is not None and cpp.ok != case.expected:
                failures.append("%s: arbiter validate says %s, the corpus expects %s (%s)" %
                                (case.name, "valid" if cpp.ok else "invalid",
                                 "valid" if case.expected else "invalid", cpp.detail))
            if case.name in ALLOWED:
                if cpp.ok or not sch.ok:
                    failures.append(
                        "%s: allow-listed (%s), but now c++ says %s and the schema %s: remove "
                        "the entry" % (case.name, ALLOWED[case.name],
                                       "valid" if cpp.ok else "invalid",
                                       "valid" if sch.ok else "invalid"))
                else:
                    counts["allowed"] += 1
                continue
            if cpp.ok != sch.ok:
                failures.append("%s: DISAGREE: c++ %s, schema %s\n    c++:    %s\n    schema: %s" %
                                (case.name, "valid" if cpp.ok else "invalid",
                                 "valid" if sch.ok else "invalid", cpp.detail, sch.detail))
            else:
                counts["agree"] += 1

    total = len(cases)
    print("schema agreement: %d files, %d agree, %d allow-listed disagreements, %d failures" %
          (total, counts["agree"], counts["allowed"], len(failures)))
    for f in failures:
        print("FAIL " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
