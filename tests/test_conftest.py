"""The suite's own guard against running out of memory maps (conftest.py: MAPS_KEPT), checked on
what it rests on: JAX's compiled programs hold maps, and jax.clear_caches gives them back; and what
a test that lacks its oracle says (helpers.ORACLE_MISSING)."""
import sys

import jax
import jax.numpy as jnp
import pytest

from conftest import MAPS_KEPT, memory_maps


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/maps is Linux's")
def test_compiled_programs_hold_maps_that_clearing_the_caches_returns():
    jax.clear_caches()
    before = memory_maps()
    for i in range(60):     # distinct programs: each one is compiled and kept
        jax.jit(lambda x, i=i: x * i + 1)(jnp.ones(i + 1)).block_until_ready()
    grown = memory_maps()
    assert grown - before >= 60, (before, grown)
    jax.clear_caches()
    assert memory_maps() - before < (grown - before) / 2, (before, grown, memory_maps())
    assert 1000 < MAPS_KEPT < grown + 10**7


def test_an_oracle_s_skip_names_the_install_that_brings_it_not_a_ci_machine_s_disk():
    """The skip said "torch's CPU wheel is on its disk for Python 3.11 only": a CI machine's disk,
    read by someone whose machine it is not. It names what installs the oracles."""
    from helpers import ORACLE_MISSING
    said = ORACLE_MISSING.format("torch")
    assert said.startswith("torch is not installed") and "disk" not in said
    assert "pip install -e '.[test]' --extra-index-url https://download.pytorch.org/whl/cpu" in said
