"""The lecture's synthetic world of people and cities, its character alphabet and fact scorer.

The lecture ("inside tiny_gpt") opens a char-level GPT trained on text about a made-up
world: facts "\\n{name} lives in {city}.", questions "\\nq: where does {name} live? a:",
reviews "\\nreview: the soup was tasty and the host was kind.". A world with right answers
is what makes its demos checkable: a head that looks at the name, or an ablation that
makes the model forget where people live, shows up as a number, not an impression.

What the lecture fixes (its generator, fm_world.py, is not in the seed; these are read
off the demo script):
  * the alphabet has 44 symbols: the uniform distribution costs log2(V) = 5.459 bits/char
    (demo 5), and V·d + T·d + L(12d² + 13d) + 2d = 109,056 with d 64, T 96, L 2 gives
    V = 44, as does the embeddings' 8.2% share. Only the size is forced; the set is not
    in the seed. Names and cities are lowercase ("base", "telmi") and the prompts use
    "\\n :?.", so it is taken as a-z, 0-9 and the 8 symbols "\\n !',.:?" (26 + 10 + 8);
  * fact completion: for every person, greedy from "\\n{name} lives in", at most 10
    characters, stopping at "." or "\\n", right iff the text is exactly " {city}.";
  * the attention demo asks "\\nq: where does {name} live? a:" and sums weight on the name;
  * bits/char runs over non-overlapping 96-character windows of the validation text.
Chosen here, where it is silent: 40 people in 8 cities (its fact accuracies 0.93 intact
and 0.05 without layer 1's attention are whole counts out of 40, 37 and 2; 40 is the
smallest group for which both are); names CV+CV, cities CVC+CV from one
syllable set; a third line kind, "q: how many people live in {city}? a: {n}.", and a
"wasn't ..., but ...!" review so that digits and the symbols ' , ! occur in training;
train text = 20 shuffled epochs, validation = 2, each epoch holding every fact, every
question and 40 reviews. The validation text shares the world (its facts are the
knowledge being tested, and the same in both) but never a review: 10% of the review
combinations are reserved for it, so its bits/char also measure generalisation.
Some symbols (j, x, several digits) never occur; their embedding rows simply stay
untrained, as with any fixed alphabet larger than the text's.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, NamedTuple

import numpy as np

from attention_jax.errors import ConfigError, DataError

ALPHABET = "\n !',.0123456789:?abcdefghijklmnopqrstuvwxyz"  # sorted; 44 symbols
CONSONANTS, VOWELS = "bdfgklmnprstvz", "aeiou"
FOODS = ("soup", "bread", "fish", "cake", "tea", "rice", "pie", "stew")
TASTES = ("tasty", "cold", "salty", "fresh", "bland", "sweet")
STAFF = ("host", "cook", "waiter", "owner")
MANNERS = ("kind", "rude", "slow", "quick", "calm", "loud")
PATTERNS = {  # kind -> full-line regex; every generated line matches exactly one
    "fact": r"(?P<name>[a-z]+) lives in (?P<city>[a-z]+)\.",
    "question": r"q: where does (?P<name>[a-z]+) live\? a: (?P<city>[a-z]+)\.",
    "count": r"q: how many people live in (?P<city>[a-z]+)\? a: (?P<n>[0-9]+)\.",
    "review": r"review: the (?P<food>[a-z]+) (?:was|wasn't) (?P<taste>[a-z]+)(?: and|, but) "
              r"the (?P<staff>[a-z]+) was (?P<manner>[a-z]+)[.!]",
}


class Person(NamedTuple):
    name: str
    city: str


@dataclasses.dataclass(frozen=True)
class WorldSpec:
    n_people: int = 40
    n_cities: int = 8
    train_epochs: int = 20
    val_epochs: int = 2
    reviews_per_epoch: int = 40
    val_review_share: float = 0.1

    def __post_init__(self):
        counts = (self.n_people, self.n_cities, self.train_epochs, self.val_epochs,
                  self.reviews_per_epoch)
        if min(counts) < 1 or max(self.n_people, self.n_cities) > 2000 \
                or not 0 < self.val_review_share < 1:
            raise ConfigError(f"{self} needs counts >= 1, at most 2000 people and cities, "
                              f"and val_review_share in (0, 1); use e.g. WorldSpec()")


@dataclasses.dataclass(frozen=True)
class World:
    people: tuple[Person, ...]
    cities: tuple[str, ...]
    train_text: str  # lines each preceded by "\n", as the fact prompt expects
    val_text: str


class CharTokenizer:
    """Characters <-> int32 ids over a fixed alphabet (default: the lecture's 44 symbols)."""

    def __init__(self, alphabet: str = ALPHABET):
        if len(set(alphabet)) != len(alphabet) or not alphabet:
            raise ConfigError(f"alphabet {alphabet!r} must be non-empty "
                              "without repeated characters")
        self.alphabet = alphabet
        self.index = {c: i for i, c in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet)

    def encode(self, text: str) -> np.ndarray:
        try:
            return np.fromiter((self.index[c] for c in text), dtype=np.int32, count=len(text))
        except KeyError as err:
            ch = err.args[0]
            raise DataError(f"character {ch!r} (U+{ord(ch):04X}) at position {text.index(ch)} is "
                            f"not in the {len(self.alphabet)}-symbol alphabet {self.alphabet!r}; "
                            f"remove or replace it") from None

    def decode(self, ids) -> str:
        return "".join(self.alphabet[int(i)] for i in np.asarray(ids).reshape(-1))


def show(text: str) -> str:
    """Printable form: a newline becomes one visible character, so columns stay aligned."""
    return text.replace("\n", "⏎")


def _words(rng, n: int, pattern: str, taken: set[str]) -> list[str]:
    """n distinct words of consonant/vowel `pattern` (e.g. "CVCV"), none in `taken`."""
    letters = {"C": CONSONANTS, "V": VOWELS}
    out: list[str] = []
    while len(out) < n:
        word = "".join(letters[p][rng.integers(len(letters[p]))] for p in pattern)
        if word not in taken:
            taken.add(word)
            out.append(word)
    return out


def build_world(spec: WorldSpec | None = None, seed: int = 0) -> World:
    """People, cities and the train/val texts; a pure function of (spec, seed)."""
    spec = spec or WorldSpec()
    rng = np.random.default_rng(seed)
    taken = {w for p in PATTERNS.values()
             for w in re.findall(r"[a-z]+", p)}  # no name may be a template word
    cities = tuple(_words(rng, spec.n_cities, "CVCCV", taken))
    names = _words(rng, spec.n_people, "CVCV", taken)
    # Every city gets someone before the rest are spread at random: no city is a dead word.
    homes = list(cities[: spec.n_people]) + \
        list(rng.choice(cities, max(0, spec.n_people - len(cities))))
    people = tuple(Person(n, str(c)) for n, c in zip(names, rng.permutation(homes)))
    combos = [(f, t, s, m, b)
              for f in FOODS for t in TASTES for s in STAFF for m in MANNERS for b in (0, 1)]
    order = rng.permutation(len(combos))
    cut = max(1, int(round(spec.val_review_share * len(combos))))
    val_combos, train_combos = [combos[i] for i in order[:cut]], [combos[i] for i in order[cut:]]

    def review(food, taste, staff, manner, but) -> str:
        if but:
            return f"review: the {food} wasn't {taste}, but the {staff} was {manner}!"
        return f"review: the {food} was {taste} and the {staff} was {manner}."

    def text(epochs: int, pool: list) -> str:
        lines: list[str] = []
        for _ in range(epochs):
            epoch = [f"{p.name} lives in {p.city}." for p in people]
            epoch += [f"q: where does {p.name} live? a: {p.city}." for p in people]
            epoch += [f"q: how many people live in {c}? a: {sum(p.city == c for p in people)}."
                      for c in cities]
            epoch += [review(*pool[i])
                      for i in rng.integers(len(pool), size=spec.reviews_per_epoch)]
            lines += [epoch[i] for i in rng.permutation(len(epoch))]
        return "".join("\n" + line for line in lines)

    return World(people, cities, text(spec.train_epochs, train_combos),
                 text(spec.val_epochs, val_combos))


def parse_line(line: str) -> tuple[str, dict[str, str]]:
    """(kind, fields) of one line of the world's text; DataError if it is none of the kinds."""
    for kind, pattern in PATTERNS.items():
        match = re.fullmatch(pattern, line)
        if match:
            return kind, match.groupdict()
    raise DataError(f"line {line!r} is not a fact, question, count or review of the tiny world")


def fact_prompt(person: Person) -> tuple[str, str]:
    """(prompt, answer) of the lecture's fact completion: "\\nbase lives in" -> " telmi."."""
    return f"\n{person.name} lives in", f" {person.city}."


def question_prompt(name: str) -> tuple[str, list[int]]:
    """The attention demo's question and the positions of the name's characters in it."""
    head = "\nq: where does "
    return f"{head}{name} live? a:", list(range(len(head), len(head) + len(name)))


def fact_accuracy(complete: Callable, tok: CharTokenizer, world: World, max_new: int = 10) -> float:
    """Share of people whose greedy completion, cut after the first "." or "\\n", is " {city}.".

    `complete(prompt_ids, n)` returns up to n generated ids (without the prompt).
    """
    right = 0
    for person in world.people:
        prompt, answer = fact_prompt(person)
        out = tok.decode(complete(tok.encode(prompt), max_new))[:max_new]
        stops = [i for i, c in enumerate(out) if c in ".\n"]
        right += out[: stops[0] + 1 if stops else len(out)] == answer
    return right / len(world.people)


def fact_batch(tok: CharTokenizer, world: World) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Teacher-forced prompt+answer rows: x, y [N, T] int32 and weights [N, T], 1 on the answer.

    Padding (right, weight 0) never reaches a scored position under a causal mask.
    """
    rows = [tok.encode(p + a) for p, a in map(fact_prompt, world.people)]
    starts = [len(fact_prompt(p)[0]) - 1 for p in world.people]  # the input that predicts the
                                                                 # answer's 1st char
    shape = (len(rows), max(map(len, rows)) - 1)
    x, y, w = np.zeros(shape, np.int32), np.zeros(shape, np.int32), np.zeros(shape, np.float32)
    for i, (ids, s) in enumerate(zip(rows, starts)):
        x[i, : len(ids) - 1], y[i, : len(ids) - 1], w[i, s : len(ids) - 1] = ids[:-1], ids[1:], 1.0
    return x, y, w


def fact_accuracy_from_logits(logits, y: np.ndarray, weights: np.ndarray) -> float:
    """Share of rows whose argmax is right at every answer position (= greedy completion right).

    Equal to `fact_accuracy` because the answer holds no "." or "\\n" before its final ".".
    """
    hit = (np.asarray(logits).argmax(-1) == y) | (weights == 0)
    return float(hit.all(axis=1).mean())
