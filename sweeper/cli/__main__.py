"""`python -m sweeper.cli`, as the `sweeper` console script."""

from sweeper.cli import main

main()
