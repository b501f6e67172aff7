"""Shared fixtures: a seeded numpy generator, and `parity`, which checks a max |diff| against
torch and lists every measured value at the end of the run (the numbers the closing note cites)."""

import numpy as np
import pytest

_PARITY = pytest.StashKey[list]()


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def parity(request):
    rows = request.config.stash.setdefault(_PARITY, [])

    def check(name, ours, theirs, atol=1e-5):
        as_np = lambda x: np.asarray(x.detach() if hasattr(x, "detach") else x, np.float64)
        diff = float(np.max(np.abs(as_np(ours) - as_np(theirs))))
        rows.append((name, diff))
        assert diff <= atol, f"{name}: max |diff| {diff:.3g} > {atol:g}"
        return diff

    return check


def pytest_terminal_summary(terminalreporter, config):
    rows = config.stash.get(_PARITY, [])
    if rows:
        terminalreporter.section("parity with torch: measured max |diff|")
        for name, diff in rows:
            terminalreporter.write_line(f"{diff:9.2e}  {name}")
