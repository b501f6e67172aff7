"""The lecture's tiny world: the 44-symbol alphabet, the generator's counts and lines, the
validation split, the prompts the demos use, and the fact-completion scorers."""

import math

import numpy as np
import pytest

from attention_jax.data import tiny_world as tw
from attention_jax.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def world():
    return tw.build_world()


@pytest.fixture(scope="module")
def tok():
    return tw.CharTokenizer()


def lines(text):
    assert text.startswith("\n") and not text.endswith("\n")
    return text[1:].split("\n")


def test_alphabet_is_the_lectures_44(tok):
    v, d, t, n_layers = tok.vocab_size, 64, 96, 2
    assert v == 44 and tw.ALPHABET == "".join(sorted(set(tw.ALPHABET)))
    # demo 1's formula: V·d + T·d + L·(12d² + 13d) + 2d (tied output, biases, final LayerNorm)
    assert v * d + t * d + n_layers * (12 * d * d + 13 * d) + 2 * d == 109_056
    assert f"{math.log2(v):.3f}" == "5.459"  # its "uniform distribution" bits/char
    assert f"{(v * d + t * d) / 109_056:.1%}" == "8.2%"  # its embeddings' share


def test_encode_decode_round_trip(tok, world):
    for text in (tw.ALPHABET, world.train_text[:5000], world.val_text):
        ids = tok.encode(text)
        assert ids.dtype == np.int32 and ids.shape == (len(text),) and tok.decode(ids) == text
    assert tok.decode(tok.encode("\nq: a?")[None, :]) == "\nq: a?"  # any shape decodes flat


def test_unknown_character_is_named(tok):
    with pytest.raises(DataError) as err:
        tok.encode("\nBase lives in telmi.")
    message = str(err.value)
    assert "'B'" in message and "position 1" in message and "44-symbol" in message and "\n" not in message
    with pytest.raises(ConfigError):
        tw.CharTokenizer("abca")


def test_world_counts(world):
    names = [p.name for p in world.people]
    assert len(names) == len(set(names)) == 40 and len(world.cities) == len(set(world.cities)) == 8
    assert not set(names) & set(world.cities)
    assert {p.city for p in world.people} == set(world.cities)  # nobody's city is a dead word
    per_epoch = 40 + 40 + 8 + 40  # facts, where-questions, count questions, reviews
    assert len(lines(world.train_text)) == 20 * per_epoch and len(lines(world.val_text)) == 2 * per_epoch
    for p in world.people:  # every fact once per epoch
        assert lines(world.train_text).count(f"{p.name} lives in {p.city}.") == 20


@pytest.mark.parametrize("part", ["train_text", "val_text"])
def test_every_line_parses_and_agrees_with_the_world(world, part):
    home = {p.name: p.city for p in world.people}
    kinds = set()
    for line in lines(getattr(world, part)):
        kind, fields = tw.parse_line(line)
        kinds.add(kind)
        if kind in ("fact", "question"):
            assert home[fields["name"]] == fields["city"]
        elif kind == "count":
            assert int(fields["n"]) == sum(c == fields["city"] for c in home.values())
        else:
            assert fields["food"] in tw.FOODS and fields["manner"] in tw.MANNERS
    assert kinds == {"fact", "question", "count", "review"}
    with pytest.raises(DataError):
        tw.parse_line("base lives near telmi.")


def test_val_shares_the_facts_but_no_review(world):
    train, val = lines(world.train_text), lines(world.val_text)
    reviews = lambda ls: {line for line in ls if line.startswith("review:")}  # noqa: E731
    assert reviews(val) and not reviews(val) & reviews(train)
    facts = lambda ls: {line for line in ls if tw.parse_line(line)[0] != "review"}  # noqa: E731
    assert facts(val) == facts(train)  # the knowledge under test is the same in both
    assert world.train_text != world.val_text


def test_deterministic_and_seed_dependent(world):
    assert tw.build_world() == world
    other = tw.build_world(seed=1)
    assert other.people != world.people and other.train_text != world.train_text
    spec = tw.WorldSpec(n_people=5, n_cities=3, train_epochs=2, val_epochs=1, reviews_per_epoch=4)
    small = tw.build_world(spec)
    assert len(small.people) == 5 and len(lines(small.train_text)) == 2 * (5 + 5 + 3 + 4)
    with pytest.raises(ConfigError):
        tw.WorldSpec(n_people=0)


def test_prompts(tok, world):
    p = world.people[0]
    prompt, answer = tw.fact_prompt(p)
    assert prompt == f"\n{p.name} lives in" and answer == f" {p.city}."
    assert prompt + answer in world.train_text
    question, where = tw.question_prompt(p.name)
    assert question == f"\nq: where does {p.name} live? a:" and question + answer in world.train_text
    assert "".join(question[i] for i in where) == p.name
    assert tw.show("\nab\n") == "⏎ab⏎"


def test_fact_accuracy_with_a_hand_made_completer(tok, world):
    right = {p.name for p in world.people[::2]}

    def complete(prompt_ids, n):
        name = tok.decode(prompt_ids)[1:].split(" ")[0]
        city = dict(world.people)[name]
        out = f" {city}.\nq: more" if name in right else f" {city}x."  # text after "." is cut
        return tok.encode(out)[:n]

    assert tw.fact_accuracy(complete, tok, world) == 0.5
    assert tw.fact_accuracy(lambda ids, n: tok.encode("\n")[:n], tok, world) == 0.0


def test_fact_accuracy_from_logits(tok, world):
    x, y, w = tw.fact_batch(tok, world)
    assert x.shape == y.shape == w.shape == (40, 20)  # "\n" + 4-letter name + " lives in" + " " + 5 + "." - 1
    assert (w.sum(1) == 7).all() and tok.decode(y[0][w[0] > 0]) == tw.fact_prompt(world.people[0])[1]
    assert tok.decode(x[0][: 14]) == tw.fact_prompt(world.people[0])[0]
    logits = np.eye(tok.vocab_size, dtype=np.float32)[y]  # a perfect model
    assert tw.fact_accuracy_from_logits(logits, y, w) == 1.0
    logits[0, -1] = logits[0, -1, ::-1]  # row 0: wrong final "."
    logits[1, 0] = 0.0                   # row 1: an unscored position changed, still right
    assert tw.fact_accuracy_from_logits(logits, y, w) == 39 / 40


def test_fact_batch_pads_uneven_rows(tok):
    people = (tw.Person("ab", "cde"), tw.Person("abcd", "c"))
    x, y, w = tw.fact_batch(tok, tw.World(people, ("cde", "c"), "", ""))
    assert x.shape == (2, len("\nabcd lives in c.") - 1) == (2, len("\nab lives in cde.") - 1)
    assert tok.decode(y[0][w[0] > 0]) == " cde." and tok.decode(y[1][w[1] > 0]) == " c."
    x, y, w = tw.fact_batch(tok, tw.World((tw.Person("ab", "cdefg"), people[1]), ("cdefg", "c"), "", ""))
    assert w[1, -2:].sum() == 0 and (x[1, -2:] == 0).all()  # right padding, never scored
    assert tw.fact_accuracy_from_logits(np.eye(44)[y], y, w) == 1.0
