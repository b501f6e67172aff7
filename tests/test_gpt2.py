"""The GPT-2 probes end to end, on a tiny random GPT-2 checkpoint the smoke preset saves itself (offline)."""
import json

import pytest

from experiments import gpt2

pytestmark = pytest.mark.slow


def test_the_probes_run_on_a_checkpoint_and_their_exact_claims_hold(tmp_path, capsys):
    assert gpt2.main(["--preset", "smoke", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "gpt2" / "results.json").read_text())
    assert [c["passed"] for c in results["claims"]] == [True, True]            # decided at any budget
    assert [len(row) for row in results["ablated"]] == [4, 4]                  # every head of both blocks
    for figure in ("attention.png", "probes.png"):
        assert (tmp_path / "gpt2" / figure).stat().st_size > 10_000
    assert (tmp_path / "gpt2" / "tiny-gpt2" / "model.safetensors").exists()


def test_a_model_it_cannot_find_is_one_line(tmp_path, capsys):
    code = gpt2.main(["--preset", "smoke", "--out", str(tmp_path), "--model", str(tmp_path / "nothing-here")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "cannot fetch" in err


def test_a_damaged_tokenizer_a_text_too_long_and_one_too_short(tmp_path, capsys):
    """A damaged tokenizer.json was passed over (raw bytes read as ids, exit 0); a text longer than the
    context left no room for the new tokens (exit 2 after every probe); one token gave a traceback."""
    import shutil
    assert gpt2.main(["--preset", "smoke", "--out", str(tmp_path / "a"), "--text", "x" * 70]) == 0   # room made
    capsys.readouterr()
    assert gpt2.main(["--preset", "smoke", "--out", str(tmp_path / "b"), "--text", "a"]) == 2
    assert "is 1 token(s)" in capsys.readouterr().err
    damaged = tmp_path / "damaged"
    shutil.copytree(tmp_path / "a" / "gpt2" / "tiny-gpt2", damaged)
    (damaged / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    assert gpt2.main(["--preset", "smoke", "--out", str(tmp_path / "c"), "--model", str(damaged)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot read the tokenizer" in err
