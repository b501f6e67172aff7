"""The chapter's word-level Winograd toy: which noun does "it" refer to?

    the {x} did not cross the {y} because it was too {adj} , so the {ref} waited .

Only one position is scored: the input "the" after "so", whose target is the referent
(index 14 of the 17 inputs, as in the book: "位置 14 的 the", 15 visible tokens at 0.067).
Adjectives pick the referent by role, not by category: tired/scared/slow/weak
make it the crosser x, wet/wide/busy/steep the crossed y. Clean task: x and y come from one
pool of 16 nouns, any noun in either slot, and the held-out pairs are those whose reverse
order is in training, so a model that knows which two nouns occurred but not their order
answers backwards. Leaky task: x is always an animal and y a place, and held-out
animal/place pairs are never seen; the category alone then names the referent.

What the book states: the template, one pool of 16 nouns, the eight adjectives and their
roles, the scored word, the reverse-order split, chance 50%; and `animal` and `street`
are nouns (its attention printout). What it does not, and is chosen here:
  * the other 14 nouns: 8 animals and 8 places, so the same pool serves the leaky task;
  * the held-out share, 1/5 of the ordered pairs: 48 of 240 clean (384 sentences, 8
    adjectives each) and 12 of 64 leaky (96). These are inferred, not quoted: 27.9% and
    92.7% are k/384 for whole k, 91.7% is 88/96, and 1/5 gives both sizes at once
    (other clean sizes fit too, e.g. 480 or 960, but not with the same share);
  * every (pair, adjective) crossing is one sentence, so training has 1536 clean and 416
    leaky sentences; held-out pairs are drawn with numpy's default_rng(seed), redrawn
    until every noun still occurs in training in the slots it is tested in;
  * accuracy is the argmax over the whole vocabulary: the book's uniform average is right
    27.9% and names the other noun 50% of the time, so 22% of its answers are neither
    noun, which a two-way choice could not show.

Words are data (`WinogradSpec`); `load_spec` reads word lists from files.
This module is pure numpy so it is cheap to test and import.
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

from attention_jax.errors import ConfigError, DataError

TEMPLATE = "the {x} did not cross the {y} because it was too {adj} , so the {ref} waited ."
ANIMALS = ("animal", "dog", "cat", "horse", "cow", "goat", "fox", "sheep")
PLACES = ("street", "road", "river", "bridge", "field", "square", "track", "yard")
ADJECTIVES = (("tired", "x"), ("scared", "x"), ("slow", "x"), ("weak", "x"),
              ("wet", "y"), ("wide", "y"), ("busy", "y"), ("steep", "y"))
KINDS = ("animal", "place")
SLOTS = ("{x}", "{y}", "{adj}", "{ref}")
# Words for pools other than the book's (`draw_pool`): none of them is one of its words
# or the template's.
MORE_ANIMALS = ("mouse", "rabbit", "deer", "wolf", "bear", "duck", "goose", "hen", "pig", "mule",
                "donkey", "camel", "lion", "tiger", "otter", "badger", "hare", "lamb", "calf",
                "pony", "moose", "boar", "frog", "turtle")
MORE_PLACES = ("lane", "canal", "stream", "valley", "meadow", "plaza", "path", "trail", "creek",
               "ditch", "ramp", "tunnel", "park", "garden", "court", "alley", "avenue", "bay",
               "pond", "lawn", "moat", "gorge", "hill", "marsh")
MORE_ADJECTIVES = {"x": ("sleepy", "lazy", "old", "afraid", "small", "hungry", "sick", "shy",
                         "lame", "nervous"),
                   "y": ("icy", "narrow", "muddy", "dark", "long", "crowded", "deep", "rough",
                         "high", "flooded")}
NOUNS_FORMAT = ("one noun per line, optionally followed by its kind animal or place; "
                "# starts a comment")
ADJECTIVES_FORMAT = "one 'word x' or 'word y' per line (x: it is the first noun, y: the second)"


@dataclasses.dataclass(frozen=True)
class WinogradSpec:
    """Nouns (with kind "animal", "place" or ""), adjectives with the side they pick, template."""

    nouns: tuple[str, ...] = ANIMALS + PLACES
    kinds: tuple[str, ...] = ("animal",) * len(ANIMALS) + ("place",) * len(PLACES)
    adjectives: tuple[tuple[str, str], ...] = ADJECTIVES
    template: str = TEMPLATE
    heldout_fraction: float = 0.2

    def __post_init__(self):
        words = self.template.split(" ")
        if sorted(w for w in words if w in SLOTS) != sorted(SLOTS) or words.index("{ref}") == 0:
            raise ConfigError(f"template {self.template!r} must hold {', '.join(SLOTS)} once each, "
                              f"space-separated, with a word before {{ref}}")
        if len(self.kinds) != len(self.nouns) or set(self.kinds) - {"", *KINDS}:
            raise ConfigError(f"kinds {self.kinds} must give one of '', 'animal', 'place' per noun")
        if not 0.0 < self.heldout_fraction <= 0.5:
            raise ConfigError(f"heldout_fraction {self.heldout_fraction} must lie in (0, 0.5]")
        seen: dict[str, str] = {w: "template" for w in words if w not in SLOTS}
        for word, role in [(n, "noun") for n in self.nouns] + \
                [(a, "adjective") for a, _ in self.adjectives]:
            if not word or any(c.isspace() for c in word) or word in seen:
                raise DataError(f"{role} {word!r} is empty, has whitespace, or is already a "
                                f"{seen.get(word, role)} word; "
                                "rename it in the nouns/adjectives file")
            if "{" in word or "}" in word:     # a slot marker as a word would be filled
                                               # in every sentence
                raise DataError(f"{role} {word!r} holds a brace, which marks the template's slots; "
                                "rename it in the nouns/adjectives file")
            seen[word] = role
        if len(self.nouns) < 2 or {s for _, s in self.adjectives} != {"x", "y"}:
            raise DataError("the task needs at least 2 nouns and at least one 'x' and one 'y' "
                            "adjective; extend the nouns/adjectives files")

    def kind(self, kind: str) -> tuple[str, ...]:
        return tuple(n for n, k in zip(self.nouns, self.kinds) if k == kind)


def _lines(path, what: str, fmt: str) -> list[tuple[int, list[str]]]:
    path = pathlib.Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"cannot read {what} file {path} ({type(err).__name__}); "
                        f"pass a UTF-8 file with {fmt}") from None
    rows = [(i, line.split("#", 1)[0].split()) for i, line in enumerate(text.splitlines(), 1)]
    rows = [(i, fields) for i, fields in rows if fields]
    if not rows:
        raise DataError(f"{what} file {path} is empty; write {fmt}")
    seen: dict[str, int] = {}
    for i, fields in rows:
        if fields[0] in seen:
            raise DataError(f"{path}:{i}: {fields[0]!r} repeats line {seen[fields[0]]}; "
                            "keep one line per word")
        seen[fields[0]] = i
    return rows


def load_nouns(path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(nouns, kinds) from a nouns file: `dog animal`, `street place`, or a bare `pebble`."""
    rows = _lines(path, "nouns", NOUNS_FORMAT)
    for i, fields in rows:
        if len(fields) > 2 or (len(fields) == 2 and fields[1] not in KINDS):
            raise DataError(f"{path}:{i}: {' '.join(fields)!r} is not one word plus an optional "
                            "animal/place; join multi-word nouns with '_' "
                            f"(e.g. {'_'.join(fields)})")
    if len(rows) < 2:
        raise DataError(f"nouns file {path} lists 1 noun; the task needs at least 2 "
                        f"({NOUNS_FORMAT})")
    return tuple(f[0] for _, f in rows), tuple(f[1] if len(f) == 2 else "" for _, f in rows)


def load_adjectives(path) -> tuple[tuple[str, str], ...]:
    """(word, side) pairs from an adjectives file of `tired x` / `wet y` lines."""
    rows = _lines(path, "adjectives", ADJECTIVES_FORMAT)
    for i, fields in rows:
        if len(fields) == 1 or (len(fields) == 2 and fields[1] not in ("x", "y")):
            raise DataError(f"{path}:{i}: adjective {fields[0]!r} has no referent x or y; "
                            f"write '{fields[0]} x' (it = first noun) or '{fields[0]} y' "
                            "(it = second noun)")
        if len(fields) > 2:
            raise DataError(f"{path}:{i}: {' '.join(fields[:-1])!r} is not one word; "
                            f"join multi-word adjectives with '_' and end the line with x or y")
    return tuple((f[0], f[1]) for _, f in rows)


def draw_pool(k: int, *, nouns_per_kind: int = 8, adjectives_per_side: int = 4,
              seed: int = 0) -> WinogradSpec:
    """Word pool `k`: 0 is the book's; any other, 8 animals, 8 places and 4 adjectives of each side
    drawn from the built-in lists (none of the book's words) with default_rng((seed, k)), the same
    pool for the same k on every machine."""
    if k == 0:
        return WinogradSpec()
    if k < 0:
        raise ConfigError(f"pool {k} does not exist; pools are 0 (the book's), 1, 2, ...")
    rng = np.random.default_rng((seed, k))
    pick = lambda words, n: tuple(words[i]
                                  for i in sorted(rng.choice(len(words), n, replace=False)))
    animals, places = pick(MORE_ANIMALS, nouns_per_kind), pick(MORE_PLACES, nouns_per_kind)
    adjectives = tuple((a, side) for side in ("x", "y")
                       for a in pick(MORE_ADJECTIVES[side], adjectives_per_side))
    return WinogradSpec(nouns=animals + places,
                        kinds=("animal",) * len(animals) + ("place",) * len(places),
                        adjectives=adjectives)


def load_spec(nouns=None, adjectives=None, base: WinogradSpec | None = None) -> WinogradSpec:
    """The book's spec, with the nouns and/or adjectives replaced by those in the given files."""
    spec = base or WinogradSpec()
    if nouns is not None:
        words, kinds = load_nouns(nouns)
        spec = dataclasses.replace(spec, nouns=words, kinds=kinds)
    if adjectives is not None:
        spec = dataclasses.replace(spec, adjectives=load_adjectives(adjectives))
    return spec


def vocabulary(spec: WinogradSpec) -> tuple[str, ...]:
    """Every word the task can write, sorted: the ids depend only on the word lists."""
    fixed = [w for w in spec.template.split(" ") if w not in SLOTS]
    return tuple(sorted({*fixed, *spec.nouns, *(a for a, _ in spec.adjectives)}))


def render(spec: WinogradSpec, x: str, y: str, adj: str) -> str:
    ref = x if dict(spec.adjectives)[adj] == "x" else y
    filled = spec.template.replace("{x}", x).replace("{y}", y).replace("{adj}", adj)
    return filled.replace("{ref}", ref)


def parse(spec: WinogradSpec, sentence: str) -> dict[str, str]:
    """{x, y, adj, ref} read back from a sentence; DataError if it does not fit the template."""
    slots, words = spec.template.split(" "), sentence.split(" ")
    got = dict(zip(slots, words)) if len(words) == len(slots) else {}
    sides = dict(spec.adjectives)
    ok = (got and all(s == w for s, w in zip(slots, words) if s not in SLOTS)
          and {got["{x}"], got["{y}"]} <= set(spec.nouns) and got["{adj}"] in sides
          and got["{ref}"] == got["{" + sides[got["{adj}"]] + "}"])
    if not ok:
        raise DataError(f"sentence {sentence!r} does not fit the template {spec.template!r}")
    return {k.strip("{}"): got[k] for k in SLOTS}


def encode(sentences, vocab: tuple[str, ...]) -> np.ndarray:
    """Word ids [N, L] int32 of equal-length sentences."""
    index = {w: i for i, w in enumerate(vocab)}
    try:
        return np.array([[index[w] for w in s.split(" ")] for s in sentences], dtype=np.int32)
    except KeyError as err:
        raise DataError(f"word {err.args[0]!r} is not in the vocabulary; "
                        f"add it to the nouns/adjectives files") from None


Pair = tuple[str, str]


def _hold_out(rng, candidates: list[Pair], n_held: int,
              reverse: bool) -> tuple[list[Pair], list[Pair]]:
    """Draw held-out pairs; with `reverse`, candidates are unordered and one order is held out."""
    for _ in range(100):  # redraw until each held-out noun is trained in the slot it is tested in
        pick = sorted(rng.choice(len(candidates), size=n_held, replace=False))
        held = [candidates[i][::-1] if reverse and rng.integers(2) else candidates[i] for i in pick]
        pool = [p for c in candidates for p in ((c, c[::-1]) if reverse else (c,))]
        train = [p for p in pool if p not in held]
        if {x for x, _ in held} <= {x for x, _ in train} \
                and {y for _, y in held} <= {y for _, y in train}:
            break  # tiny pools may never pass; their last draw is still a valid split
    return train, sorted(held, key=pool.index)


def clean_pairs(spec: WinogradSpec, seed: int = 0) -> tuple[list[Pair], list[Pair]]:
    """(train, held-out) ordered pairs: each held-out (x, y) is trained only as (y, x)."""
    n = spec.nouns
    unordered = [(a, b) for i, a in enumerate(n) for b in n[i + 1:]]
    n_held = min(len(unordered), max(1, int(spec.heldout_fraction * 2 * len(unordered) + 1e-9)))
    return _hold_out(np.random.default_rng(seed), unordered, n_held, reverse=True)


def leaky_pairs(spec: WinogradSpec, seed: int = 0) -> tuple[list[Pair], list[Pair]]:
    """(train, held-out) (animal, place) pairs; held-out pairs never occur in training."""
    pairs = [(a, p) for a in spec.kind("animal") for p in spec.kind("place")]
    if len(pairs) < 2:
        raise DataError("the leaky task needs animal and place nouns (at least 2 pairs); "
                        "mark them in the nouns file as e.g. 'dog animal' and 'street place'")
    n_held = min(len(pairs) - 1, max(1, int(spec.heldout_fraction * len(pairs) + 1e-9)))
    return _hold_out(np.random.default_rng(seed), pairs, n_held, reverse=False)


@dataclasses.dataclass(frozen=True, eq=False)
class WinogradSplit:
    """Sentences, next-token arrays x/y [N, T], the scored position and what each sentence is."""

    sentences: tuple[str, ...]
    x: np.ndarray          # [N, T] int32 inputs
    y: np.ndarray          # [N, T] int32 next-word targets
    weights: np.ndarray    # [N, T] float32, 1 only at `position`
    position: int          # scored input position (the "the" after "so"); y[:, position] == ref_id
    x_noun: np.ndarray     # [N] str, and likewise y_noun, adj, side ("x" or "y")
    y_noun: np.ndarray
    adj: np.ndarray
    side: np.ndarray
    ref_id: np.ndarray     # [N] int32 id of the right noun
    other_id: np.ndarray   # [N] int32 id of the other noun in the sentence


@dataclasses.dataclass(frozen=True, eq=False)
class WinogradTask:
    spec: WinogradSpec
    leaky: bool
    vocab: tuple[str, ...]
    train_pairs: list[Pair]
    heldout_pairs: list[Pair]
    train: WinogradSplit
    heldout: WinogradSplit


def _split(spec: WinogradSpec, vocab: tuple[str, ...], pairs: list[Pair]) -> WinogradSplit:
    rows = [(x, y, a, s) for x, y in pairs for a, s in spec.adjectives]
    sentences = tuple(render(spec, x, y, a) for x, y, a, _ in rows)
    ids = encode(sentences, vocab)
    pos = spec.template.split(" ").index("{ref}") - 1
    weights = np.zeros(ids[:, 1:].shape, np.float32)
    weights[:, pos] = 1.0
    cols = [np.array([r[i] for r in rows], dtype=str) for i in range(4)]
    ref = np.where(cols[3] == "x", cols[0], cols[1])
    other = np.where(cols[3] == "x", cols[1], cols[0])
    ids_of = np.vectorize(vocab.index, otypes=[np.int32])
    return WinogradSplit(sentences, ids[:, :-1], ids[:, 1:], weights, pos, *cols, ids_of(ref),
                         ids_of(other))


def make_task(spec: WinogradSpec | None = None, *, leaky: bool = False,
              seed: int = 0) -> WinogradTask:
    """The clean (or leaky) task: every train/held-out pair crossed with every adjective."""
    spec = spec or WinogradSpec()
    train, held = (leaky_pairs if leaky else clean_pairs)(spec, seed)
    vocab = vocabulary(spec)
    return WinogradTask(spec, leaky, vocab, train, held, _split(spec, vocab, train),
                        _split(spec, vocab, held))


def score(logits, split: WinogradSplit) -> dict:
    """Shares of sentences whose argmax at the scored position is the referent / the other noun.

    `logits` is [N, T, V] (the model's output) or [N, V] (already at the scored position).
    """
    logits = np.asarray(logits)
    at = logits[:, split.position] if logits.ndim == 3 else logits
    if at.shape[0] != len(split.sentences):
        raise ConfigError(f"logits for {at.shape[0]} sentences scored against "
                          f"{len(split.sentences)}")
    pick = at.argmax(-1)
    right, other = pick == split.ref_id, pick == split.other_id
    by_adj = {a: float(right[split.adj == a].mean()) for a in dict.fromkeys(split.adj.tolist())}
    return {"n": int(len(pick)), "accuracy": float(right.mean()), "other_noun": float(other.mean()),
            "neither": float(1.0 - right.mean() - other.mean()), "by_adjective": by_adj}
