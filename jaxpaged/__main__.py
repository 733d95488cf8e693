"""`python -m jaxpaged ...` runs the `jaxpaged` command (serve, generate, bench), as `python -m vllm` would."""

import sys

from jaxpaged.cli import main

sys.exit(main())
