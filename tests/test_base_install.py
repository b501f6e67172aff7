"""Every experiment runs on the base install (`pip install attention_jax`, no test extra): its smoke preset
with the oracles (torch, transformers, TransformerLens) hidden from import, exit 0, each comparison that
needs one left out with one line naming what to install, and its claims not checked, never passed.

Run by CI's Python 3.12 leg (`-m "not slow or base_install"`), where the oracles are not installed at all;
the leg that has them skips it (hiding them there would run every experiment a second time)."""
import json
import os
import subprocess
import sys

import pytest

from experiments.all import EXPERIMENTS
from experiments.harness.oracles import missing

ORACLES = ("torch", "transformers", "transformer_lens")
HIDE = """
import importlib.abc, sys
class Hidden(importlib.abc.MetaPathFinder):      # as if the test extra were not installed
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {"torch", "transformers", "transformer_lens"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Hidden())
"""
LEFT_OUT = {"parity": "every comparison with PyTorch", "throughput": "PyTorch's step",
            "generation": "transformers' generate", "patching": "TransformerLens' loops"}


@pytest.mark.slow
@pytest.mark.base_install
@pytest.mark.skipif(not missing(*ORACLES), reason="the oracles are installed here: CI's Python 3.12 leg, which "
                                                  "has none of them, runs this")
def test_every_experiment_runs_its_smoke_preset_without_the_oracles(tmp_path, corpus_folder, bpe_cache):
    (tmp_path / "hide").mkdir()
    (tmp_path / "hide" / "sitecustomize.py").write_text(HIDE)
    env = dict(os.environ, ATTENTION_JAX_DATA=str(corpus_folder), ATTENTION_JAX_CACHE=str(bpe_cache),
               PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path / "hide"), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-m", "experiments.all", "--preset", "smoke", "--no-progress", "--out",
                          str(tmp_path / "results")], env=env, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    for name, what in LEFT_OUT.items():
        assert f"{what}: not measured, " in out.stdout and "pip install -e '.[test]'" in out.stdout, name
    report = (tmp_path / "results" / "REPORT.md").read_text()
    assert all(f"\n# {name} (preset: smoke)" in report for name in EXPERIMENTS), report[:2000]
    for name in LEFT_OUT:
        claims = json.loads((tmp_path / "results" / name / "results.json").read_text())["claims"]
        assert any(c.get("why") for c in claims), name                  # some claim needed the oracle
        assert not any(c.get("why") and c.get("decided", True) for c in claims)
        assert all(c.get("decided") is False for c in claims if c.get("why"))
