"""`python -m sweeper.manifests`."""

import sys

from sweeper.manifests.command import main

if __name__ == "__main__":
    sys.exit(main())
