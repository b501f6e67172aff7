"""The oracles some comparisons need beyond the base install: PyTorch, transformers, TransformerLens.

Every experiment runs on the base install. A comparison whose oracle is missing is left out
with one line (`note`) naming what to install; its table's cells say `NOT_MEASURED`, and the
claims that need it are reported as not checked (`report.unchecked`), never as passed.
"""
from __future__ import annotations

import importlib.util
import sys

NAMES = {"torch": "PyTorch", "transformers": "Hugging Face transformers", "transformer_lens": "TransformerLens"}
INSTALL = "pip install -e '.[test]' --extra-index-url https://download.pytorch.org/whl/cpu"
NOT_MEASURED = "not measured"


def missing(*packages: str) -> list[str]:
    """Those of `packages` that cannot be imported here: not installed, or hidden (sys.modules[name] None)."""
    gone = []
    for name in packages:
        try:
            found = sys.modules[name] is not None if name in sys.modules else importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            gone.append(name)
    return gone


def absent(packages) -> str:
    """'TransformerLens is not installed', 'PyTorch and transformers are not installed'."""
    names = [NAMES.get(p, p) for p in packages]
    return f"{' and '.join(names)} {'is' if len(names) == 1 else 'are'} not installed"


def note(what: str, packages) -> str:
    """One line for what a run leaves out: "<what>: not measured, <oracles> not installed (<how to install>)"."""
    return f"{what}: {NOT_MEASURED}, {absent(packages)} (the test oracles: {INSTALL})"
