"""`python -m jaxpaged.server [flags]`: the same server as `jaxpaged serve`, without the rest of the CLI."""

import argparse
import sys

from jaxpaged.server.launcher import serve_main
from jaxpaged.server.serve_flags import add_serve_arguments


def main() -> int:
    """Parses the serve flags and serves."""
    parser = argparse.ArgumentParser(prog="python -m jaxpaged.server", description=__doc__)
    add_serve_arguments(parser)
    return serve_main(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
