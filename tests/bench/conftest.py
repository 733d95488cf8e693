"""The bench measures engines as they serve: warmed up at start-up, so a measured repeat compiles nothing."""

from collections.abc import Iterator

import pytest

from tests.lazy_compile import warmed_up_as_served


@pytest.fixture(autouse=True, scope="module")
def _engines_warm_up_as_served() -> Iterator[None]:
    """Every engine a bench test builds in this process warms up at start-up (module scope: before the module's
    own engine and sweep fixtures, which the autouse order sets up after this one)."""
    with warmed_up_as_served():
        yield
