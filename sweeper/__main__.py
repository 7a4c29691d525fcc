"""`python -m sweeper`: the `sweeper` command, where the console script is not on the PATH (a
check image run with a bare interpreter, a virtual environment not activated)."""

from sweeper.cli import main

main(prog_name="sweeper")
