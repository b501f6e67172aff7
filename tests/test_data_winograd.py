"""The Winograd toy's generator: split sizes, the reverse-order held-out rule, the template,
the scored position, the leaky variant, word-list files and the accuracy scorer."""

import numpy as np
import pytest

from attention_jax.data import winograd as wg
from attention_jax.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def clean():
    return wg.make_task(seed=0)


@pytest.fixture(scope="module")
def leaky():
    return wg.make_task(leaky=True, seed=0)


def pairs_of(split):
    return set(zip(split.x_noun.tolist(), split.y_noun.tolist()))


def test_book_word_lists():
    spec = wg.WinogradSpec()
    assert len(spec.nouns) == 16 and {"animal", "street"} <= set(spec.nouns)
    assert [a for a, s in spec.adjectives if s == "x"] == ["tired", "scared", "slow", "weak"]
    assert [a for a, s in spec.adjectives if s == "y"] == ["wet", "wide", "busy", "steep"]
    assert len(spec.kind("animal")) == len(spec.kind("place")) == 8


def test_clean_counts(clean):
    assert len(clean.train_pairs) + len(clean.heldout_pairs) == 16 * 15  # every ordered pair, once
    assert (len(clean.train_pairs), len(clean.heldout_pairs)) == (192, 48)
    assert clean.train.x.shape == clean.train.y.shape == clean.train.weights.shape == (1536, 17)
    assert clean.heldout.x.shape == (384, 17) and clean.heldout.x.dtype == np.int32
    assert pairs_of(clean.heldout) == set(clean.heldout_pairs)


def test_heldout_pairs_seen_only_reversed(clean):
    trained = pairs_of(clean.train)
    for x, y in clean.heldout_pairs:
        assert (y, x) in trained and (x, y) not in trained
    # ...and every held-out noun was trained in the slot it is tested in
    assert set(clean.heldout.x_noun) <= set(clean.train.x_noun)
    assert set(clean.heldout.y_noun) <= set(clean.train.y_noun)


@pytest.mark.parametrize("task", ["clean", "leaky"])
def test_every_sentence_parses_and_scores_the_referent(task, request):
    t = request.getfixturevalue(task)
    for split in (t.train, t.heldout):
        pos = split.position
        assert pos == 14 and (split.weights.sum(1) == 1).all() and (split.weights[:, pos] == 1).all()
        assert {t.vocab[i] for i in split.x[:, pos]} == {"the"}
        assert {t.vocab[i] for i in split.x[:, pos - 1]} == {"so"}
        assert (split.y[:, pos] == split.ref_id).all() and (split.ref_id != split.other_id).all()
        assert (split.x[:, 1:] == split.y[:, :-1]).all()  # next-token targets
        for i, sentence in enumerate(split.sentences):
            got = wg.parse(t.spec, sentence)
            assert (got["x"], got["y"], got["adj"]) == (split.x_noun[i], split.y_noun[i], split.adj[i])
            assert got["ref"] == (got["x"] if split.side[i] == "x" else got["y"]) == t.vocab[split.ref_id[i]]
            assert " ".join(t.vocab[j] for j in split.x[i]) + " ." == sentence


def test_parse_rejects_a_wrong_referent():
    spec = wg.WinogradSpec()
    bad = "the dog did not cross the road because it was too tired , so the road waited ."
    with pytest.raises(DataError, match="does not fit"):
        wg.parse(spec, bad)
    with pytest.raises(DataError):
        wg.parse(spec, "the dog waited .")


def test_leaky_task(leaky):
    spec = leaky.spec
    assert (len(leaky.train_pairs), len(leaky.heldout_pairs)) == (52, 12)
    assert leaky.train.x.shape == (416, 17) and leaky.heldout.x.shape == (96, 17)
    for split in (leaky.train, leaky.heldout):
        assert set(split.x_noun) <= set(spec.kind("animal")) and set(split.y_noun) <= set(spec.kind("place"))
    assert not pairs_of(leaky.train) & pairs_of(leaky.heldout)


def test_deterministic_and_seed_dependent(clean):
    again = wg.make_task(seed=0)
    assert again.heldout.sentences == clean.heldout.sentences and again.vocab == clean.vocab
    assert np.array_equal(again.train.x, clean.train.x)
    assert wg.make_task(seed=1).heldout_pairs != clean.heldout_pairs


def test_vocabulary_sorted_and_complete(clean):
    assert clean.vocab == tuple(sorted(clean.vocab)) and len(clean.vocab) == 36  # 12 template + 16 + 8


def test_score_hand_made_logits(clean):
    split = clean.heldout
    n, v = len(split.sentences), len(clean.vocab)
    logits = np.zeros((n, split.x.shape[1], v), np.float32)
    rows = np.arange(n)
    logits[rows[: n // 2], split.position, split.ref_id[: n // 2]] = 1.0      # half right
    logits[rows[n // 2:], split.position, split.other_id[n // 2:]] = 1.0      # a quarter the other noun
    logits[rows[3 * n // 4:], split.position, clean.vocab.index("waited")] = 2.0  # a quarter neither
    got = wg.score(logits, split)
    assert (got["n"], got["accuracy"], got["other_noun"], got["neither"]) == (n, 0.5, 0.25, 0.25)
    assert set(got["by_adjective"]) == {a for a, _ in clean.spec.adjectives}
    assert wg.score(logits[:, split.position], split)["accuracy"] == 0.5  # [N, V] accepted too
    with pytest.raises(ConfigError):
        wg.score(logits[:3], split)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_files_round_trip_and_drive_the_task(tmp_path):
    nouns = write(tmp_path, "nouns.txt", "# four words\ncat animal\ndog animal\nroad place\npebble\n")
    adjs = write(tmp_path, "adj.txt", "tired x  # the crosser\nwet y\n")
    spec = wg.load_spec(nouns, adjs)
    assert spec.nouns == ("cat", "dog", "road", "pebble") and spec.kinds == ("animal", "animal", "place", "")
    assert spec.adjectives == (("tired", "x"), ("wet", "y")) and spec.template == wg.TEMPLATE
    task = wg.make_task(spec)
    assert (len(task.train_pairs), len(task.heldout_pairs)) == (10, 2)  # 12 ordered pairs, a fifth held out
    assert len(task.heldout.sentences) == 2 * 2
    assert wg.make_task(spec, leaky=True).heldout_pairs  # 2 animal/place pairs: one held out
    default = write(tmp_path, "default.txt", "".join(f"{n} {k}\n" for n, k in zip(wg.ANIMALS + wg.PLACES,
                                                                                    wg.WinogradSpec().kinds)))
    assert wg.load_spec(default) == wg.WinogradSpec()


@pytest.mark.parametrize("name, text, loader, needle", [
    ("nouns.txt", "", wg.load_nouns, "is empty"),
    ("nouns.txt", "# only a comment\n\n", wg.load_nouns, "is empty"),
    ("nouns.txt", "cat\ndog\ncat\n", wg.load_nouns, "repeats line 1"),
    ("nouns.txt", "cat\n", wg.load_nouns, "at least 2"),
    ("nouns.txt", "cat\nbig dog\n", wg.load_nouns, "not one word"),
    ("nouns.txt", "cat\ndog planet\n", wg.load_nouns, "not one word"),
    ("adj.txt", "tired x\nwet\n", wg.load_adjectives, "has no referent"),
    ("adj.txt", "tired x\nwet z\n", wg.load_adjectives, "has no referent"),
    ("adj.txt", "very tired x\n", wg.load_adjectives, "not one word"),
    ("adj.txt", "wet y\nwet x\n", wg.load_adjectives, "repeats line 1"),
])
def test_bad_files_give_one_line_naming_the_file(tmp_path, name, text, loader, needle):
    path = write(tmp_path, name, text)
    with pytest.raises(DataError) as err:
        loader(path)
    assert needle in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_missing_file_and_cross_file_clashes(tmp_path):
    with pytest.raises(DataError, match="cannot read nouns file .*missing.txt"):
        wg.load_nouns(tmp_path / "missing.txt")
    clash = write(tmp_path, "nouns.txt", "cat\nthe\n")  # "the" is a template word
    with pytest.raises(DataError, match="'the'"):
        wg.load_spec(clash)
    one_side = write(tmp_path, "adj.txt", "tired x\nslow x\n")
    with pytest.raises(DataError, match="one 'x' and one 'y'"):
        wg.load_spec(adjectives=one_side)
    with pytest.raises(DataError, match="animal and place"):
        wg.make_task(wg.load_spec(write(tmp_path, "plain.txt", "cat\ndog\n")), leaky=True)
    with pytest.raises(ConfigError, match="template"):
        wg.WinogradSpec(template="the {x} saw the {y} .")
    braces = write(tmp_path, "braces.txt", "cat\n{ref}\n")          # a slot marker as a noun
    with pytest.raises(DataError, match="holds a brace"):
        wg.load_spec(braces)


def test_word_pools_are_drawn_the_same_every_time_clash_with_nothing_and_keep_the_kinds_balanced():
    assert wg.draw_pool(0) == wg.WinogradSpec()                          # pool 0: the book's
    book = set(wg.WinogradSpec().nouns) | {a for a, _ in wg.WinogradSpec().adjectives}
    template = set(wg.TEMPLATE.split(" ")) - set(wg.SLOTS)
    drawn = [wg.draw_pool(k) for k in range(1, 6)]
    assert drawn == [wg.draw_pool(k) for k in range(1, 6)]              # deterministic
    assert len({p.nouns for p in drawn}) == 5                            # and different pools
    for p in drawn:
        words = set(p.nouns) | {a for a, _ in p.adjectives}
        assert not words & book and not words & template and len(words) == 24
        assert p.kinds.count("animal") == p.kinds.count("place") == 8
        assert [s for _, s in p.adjectives].count("x") == [s for _, s in p.adjectives].count("y") == 4
        wg.make_task(p, leaky=True)                                      # the leaky task can be made from it
    with pytest.raises(ConfigError, match="pool -1 does not exist"):
        wg.draw_pool(-1)
