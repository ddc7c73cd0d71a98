"""`python -m arbiter ARGS...` is the installed `arbiter` program (see _cli.py)."""

from ._cli import main

main()
