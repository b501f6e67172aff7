"""The oracles some comparisons need beyond the base install: PyTorch, transformers, TransformerLens.

Every experiment runs on the base install. A comparison whose oracle is missing is left out
with one line (`note`) naming what to install; its table's cells say `NOT_MEASURED`, and the
claims that need it are reported as not checked (`report.unchecked`), never as passed.
"""
from __future__ import annotations

from experiments.harness.platform import _module_found

NAMES = {"torch": "PyTorch", "transformers": "Hugging Face transformers", "transformer_lens": "TransformerLens"}
INSTALL = "pip install -e '.[test]' --extra-index-url https://download.pytorch.org/whl/cpu"
NOT_MEASURED = "not measured"


def missing(*packages: str) -> list[str]:
    """Those of `packages` that cannot be imported here: not installed, or hidden (sys.modules[name] None,
    which `find_spec` reads as not found)."""
    return [name for name in packages if not _module_found(name)]


def absent(packages) -> str:
    """'TransformerLens is not installed', 'PyTorch and transformers are not installed'."""
    names = [NAMES.get(p, p) for p in packages]
    return f"{' and '.join(names)} {'is' if len(names) == 1 else 'are'} not installed"


def note(what: str, packages) -> str:
    """One line for what a run leaves out: "<what>: not measured, <oracles> not installed (<how to install>)"."""
    return f"{what}: {NOT_MEASURED}, {absent(packages)} (the test oracles: {INSTALL})"
