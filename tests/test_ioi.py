"""experiments.ioi and its prompts: the paper's template in both orders with five distinct names, the ABC
corruption repeating none; heads ranked by the edges out of them; the smoke run end to end, which says that
its figures are a random model's and checks no claim."""
import json

import numpy as np
import pytest

from attention_jax.analysis.discovery import EdgeScores
from attention_jax.analysis.edges import Graph
from experiments import ioi
from experiments.ioi_prompts import NAMES, prompts, words


def test_each_prompt_names_its_subject_twice_and_its_corruption_three_others_once():
    made = prompts(40, seed=3)
    assert [p["form"] for p in made[:2]] == ["BABA", "ABBA"] and prompts(40, seed=3) == made
    for p in made:
        said = [w.strip() for w in words(p["text"]) if w.strip() in NAMES]
        other = [w.strip() for w in words(p["corrupted"]) if w.strip() in NAMES]
        assert sorted(said) == sorted([p["io"], p["s"], p["s"]]) and p["text"].endswith("to")
        assert len(set(other)) == 3 and not set(other) & {p["io"], p["s"]}
        assert len(words(p["text"])) == len(words(p["corrupted"])) == 15


def test_words_cut_as_gpt2_pre_tokenizes():
    assert words("Then, Mary and John went to the store.") == ["Then", ",", " Mary", " and", " John", " went",
                                                                " to", " the", " store", "."]


def test_a_heads_rank_is_by_the_summed_size_of_the_edges_out_of_it():
    g = Graph(("embed", "0.h0", "0.h1", "1.h0"), ("logits",), ((0, 0), (1, 0), (2, 0), (3, 0)))
    scores = EdgeScores(g, np.array([9.0, -0.5, 0.2, 0.3]), "exact", 1.0)
    assert ioi.head_ranks(scores) == {"0.0": 1, "1.0": 2, "0.1": 3}


@pytest.mark.slow
def test_the_smoke_run_says_its_weights_are_random_and_checks_no_claim(tmp_path):
    assert ioi.main(["--preset", "smoke", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "ioi" / "results.json").read_text())
    assert not results["config"]["real_weights"] and "random weights" in results["config"]["weights"]
    assert all(c.get("decided") is False for c in results["claims"]) and len(results["claims"]) == 2
    heads = [r for r in results["rows"] if r["kind"] == "head"]
    assert [r["head"] for r in heads][:3] == ["9.6", "9.9", "10.0"] and len(heads) == 13
