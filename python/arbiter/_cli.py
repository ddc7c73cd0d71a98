"""The `arbiter` command of an installed package: runs the installed program.

pip puts a console script named `arbiter` on the environment's PATH (see
pyproject.toml); it calls main(), which replaces this Python process with the
program the package carries (arbiter/bin/arbiter in the wheel), so signals,
exit codes and `arbiter launch` behave as if the program had been started
directly. The program finds its libraries and backend modules relative to
itself (RUNPATH $ORIGIN/../lib), with no environment variable.
"""

from __future__ import annotations

import os
import sys

from ._library import installed_folder


def program_path() -> str:
    """The installed `arbiter` program; raises FileNotFoundError when there is none."""
    bindir = installed_folder("BINDIR")
    if bindir is None:
        raise FileNotFoundError(
            "this arbiter package is not installed (no _install.py), so it has no program: "
            "install it (pip install . or cmake --install), or run build/bin/arbiter"
        )
    path = os.path.join(bindir, "arbiter")
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"{path} is missing: the install is incomplete (reinstall arbiter)")
    return path


def main() -> None:
    try:
        path = program_path()
    except FileNotFoundError as e:
        sys.exit(f"arbiter: {e}")
    os.execv(path, [path, *sys.argv[1:]])
