#!/usr/bin/env python3
"""Keeps the command transcripts in the project's markdown true.

A transcript is a fenced block preceded by a marker comment:

    <!-- transcript: arbiter decide --capability 90 --world-size 8 --bytes 1MiB --explain -->
    ```
    $ arbiter decide --capability 90 --world-size 8 --bytes 1MiB --explain
    decision: ...
    ```

The command (it must start with `arbiter`; a marker may span lines, with `\\`
continuations) is run with the built program on the embedded default tables
(every ARBITER_* variable removed, the source root as working directory) and
the block must equal `$ COMMAND` followed by what it printed (stdout and
stderr; trailing blanks ignored). A command expected to exit non-zero says
so (`transcript exit=1:`); `transcript head=N:` compares the first N lines.

Output that depends on the machine (timings, paths, the modules built) is
marked `<!-- recorded: WHERE AND WHEN -->` instead: not rerun, but every
`tables <16 hex digits>` in it must be the default tables' fingerprint.

`check` fails on a drifted transcript or fingerprint, on a `default.yaml:L:C`
citation outside a transcript block (nothing keeps it true), and on an
unmarked fenced block that looks like arbiter's output. `write` regenerates
every transcript and fingerprint in place (scripts/regen-doc-transcripts.sh).
"""

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

MARKER = re.compile(r"<!--\s*(transcript((?:\s+(?:exit|head)=\d+)*)|recorded)\s*:(.*?)-->", re.S)
FENCE = re.compile(r"^(```+|~~~+)")
CITATION = re.compile(r"default\.yaml:\d+:\d+")
FINGERPRINT = re.compile(r"(\btables )([0-9a-f]{16})\b")
# Lines that only arbiter's output has: an unmarked block holding one is a
# transcript nothing checks.
LOOKS_LIKE_OUTPUT = [
    re.compile(r"^decision: "),
    re.compile(r"^\$ arbiter\b"),
    re.compile(r"^\[rank \d+\] "),
    re.compile(r"\btables [0-9a-f]{16}\b"),
    re.compile(r"\bABI v\d+\s+(available|unavailable)"),
    re.compile(r"^capability \w+, world size \d+"),
    re.compile(r"^fusion cap \(largest fused message\)"),
    CITATION,
]
SKIP_DIRS = {"node_modules", "__pycache__"}


def markdown_files(root: Path):
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        # Hidden folders, build trees and device-check reports are not docs.
        dirnames[:] = sorted(
            n
            for n in dirnames
            if not n.startswith((".", "build", "device-check-"))
            and n not in SKIP_DIRS
            and not (d / n / "CMakeCache.txt").exists()
        )
        for name in sorted(filenames):
            if name.endswith(".md"):
                yield d / name


class Block:
    """A fenced block: lines [start, end) of the file are its body."""

    def __init__(self, fence_line, start, end, marker):
        self.fence_line = fence_line  # index of the opening fence
        self.start = start
        self.end = end
        self.marker = marker  # (kind, exit, text) or None


def parse_blocks(lines):
    blocks = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence = m.group(1)
        j = i + 1
        while j < len(lines) and not lines[j].startswith(fence):
            j += 1
        blocks.append(Block(i, i + 1, j, marker_before(lines, i)))
        i = j + 1
    return blocks


def marker_before(lines, fence_line):
    """The marker comment that ends on the line right above the fence, if any."""
    k = fence_line - 1
    if k < 0 or not lines[k].rstrip().endswith("-->"):
        return None
    while k >= 0 and "<!--" not in lines[k]:
        k -= 1
    if k < 0:
        return None
    m = MARKER.fullmatch("\n".join(lines[k:fence_line]).strip())
    if not m:
        return None
    if m.group(1) == "recorded":
        return ("recorded", {}, m.group(3).strip())
    options = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2) or "")}
    return ("transcript", options, m.group(3).strip())


def command_lines(text):
    """The marker's command as the reader sees it: one line per continuation."""
    return [l.strip() for l in text.strip().splitlines()]


def run(arbiter: str, root: Path, text: str):
    argv = shlex.split(" ".join(l.rstrip("\\").strip() for l in command_lines(text)))
    if not argv or argv[0] != "arbiter":
        raise SystemExit(f"a transcript runs the arbiter program; this one runs {argv[:1]}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARBITER_")}
    env["LC_ALL"] = "C"
    p = subprocess.run(
        [arbiter] + argv[1:],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    return p.returncode, p.stdout


def expected_body(text, output, head):
    """`$ COMMAND` and the output (its first `head` lines when the marker says
    so), without trailing blanks: editors strip them, and they carry nothing."""
    cmd = command_lines(text)
    body = ["$ " + cmd[0]] + ["  " + l for l in cmd[1:]]
    out = output.rstrip("\n").split("\n")
    if head:
        out = out[:head]
    return [l.rstrip() for l in body + out]


def default_fingerprint(arbiter, root):
    rc, out = run(arbiter, root, "arbiter decide --capability 90 --world-size 8 --bytes 1MiB --json")
    m = re.search(r'"fingerprint"\s*:\s*"([0-9a-f]{16})"', out)
    if rc != 0 or not m:
        raise SystemExit(f"cannot read the default tables' fingerprint from arbiter decide --json:\n{out}")
    return m.group(1)


def process(path: Path, root: Path, arbiter: str, fingerprint: str, write: bool):
    """Returns (problems, new_text or None)."""
    rel = path.relative_to(root)
    lines = path.read_text(encoding="utf-8").split("\n")
    blocks = parse_blocks(lines)
    problems = []
    inside_transcript = set()
    replacements = []  # (start, end, new_body)
    for b in blocks:
        where = f"{rel}:{b.fence_line + 1}"
        body = lines[b.start : b.end]
        if b.marker is None:
            for n, line in enumerate(body):
                if any(p.search(line) for p in LOOKS_LIKE_OUTPUT):
                    problems.append(
                        f"{rel}:{b.start + n + 1}: error: this block looks like arbiter's output "
                        f"but has no marker: put <!-- transcript: arbiter ... --> (rerun and "
                        f"compared by the docs test) or <!-- recorded: where and when --> "
                        f"(timings; not rerun) on the line above its fence ({where})"
                    )
                    break
            continue
        kind, options, text = b.marker
        want_exit = options.get("exit", 0)
        if kind == "recorded":
            new = [FINGERPRINT.sub(lambda m: m.group(1) + fingerprint, l) for l in body]
            for n, (old, fixed) in enumerate(zip(body, new)):
                if old != fixed:
                    problems.append(
                        f"{rel}:{b.start + n + 1}: error: the default tables' fingerprint is now "
                        f"{fingerprint}; run scripts/regen-doc-transcripts.sh"
                    )
            if new != body:
                replacements.append((b.start, b.end, new))
            continue
        inside_transcript.update(range(b.start, b.end))
        rc, out = run(arbiter, root, text)
        if rc != want_exit:
            problems.append(
                f"{where}: error: `{' '.join(command_lines(text))}` exited {rc}, the marker "
                f"expects {want_exit} (write `transcript exit={rc}:` if that is right):\n{out}"
            )
            continue
        want = expected_body(text, out, options.get("head"))
        if want != [l.rstrip() for l in body]:
            diff = first_difference([l.rstrip() for l in body], want)
            problems.append(
                f"{rel}:{b.start + diff + 1}: error: transcript differs from what the command "
                f"prints on the embedded defaults; run scripts/regen-doc-transcripts.sh\n"
                f"    doc:     {body[diff] if diff < len(body) else '(nothing)'}\n"
                f"    program: {want[diff] if diff < len(want) else '(nothing)'}"
            )
            replacements.append((b.start, b.end, want))
    for n, line in enumerate(lines):
        if n in inside_transcript:
            continue
        for m in CITATION.finditer(line):
            problems.append(
                f"{rel}:{n + 1}:{m.start() + 1}: error: citation {m.group(0)} is outside a "
                f"transcript block, so no test keeps it true: show it in a block marked "
                f"<!-- transcript: arbiter decide ... --explain --> instead"
            )
    if not write or not replacements:
        return problems, None
    for start, end, new in sorted(replacements, reverse=True):
        lines[start:end] = new
    return problems, "\n".join(lines)


def first_difference(a, b):
    for n, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return n
    return min(len(a), len(b))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["check", "write"])
    ap.add_argument("--arbiter", required=True, help="the built arbiter program")
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent.parent), help="source tree")
    ap.add_argument("files", nargs="*", help="markdown files (default: every .md of the tree)")
    args = ap.parse_intermixed_args()
    root = Path(args.root).resolve()
    arbiter = str(Path(args.arbiter).resolve())
    fingerprint = default_fingerprint(arbiter, root)
    files = [Path(f).resolve() for f in args.files] or list(markdown_files(root))
    problems, transcripts, changed = [], 0, []
    for f in files:
        text = f.read_text(encoding="utf-8")
        transcripts += sum(1 for m in MARKER.finditer(text) if m.group(1) != "recorded")
        p, new = process(f, root, arbiter, fingerprint, args.mode == "write")
        if new is not None:
            f.write_text(new, encoding="utf-8")
            changed.append(str(f.relative_to(root)))
        problems += p
    if args.mode == "write":
        print(f"doc_transcripts: {len(files)} files, {transcripts} transcripts; rewrote: "
              f"{', '.join(changed) or 'nothing'}")
        left = [p for p in problems if "regen-doc-transcripts" not in p]
        for p in left:
            print(p, file=sys.stderr)
        return 1 if left else 0
    for p in problems:
        print(p, file=sys.stderr)
    print(f"doc_transcripts: {len(files)} files, {transcripts} transcripts, tables {fingerprint}: "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
