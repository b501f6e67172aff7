"""Indirect object identification prompts (Wang et al. 2022): "Then, Mary and John went to the store.
John gave a drink to" -> " Mary", and their corrupted "ABC" counterparts, where three other names
stand in ("Then, Anna and Kyle went to the store. Bryan gave a drink to"): no name repeats, so
nothing tells the model which one to give it to.

The templates are the paper's first (its BABA form, and ABBA, the first clause's names swapped), the
names, places and objects its dataset's (redwoodresearch/Easy-Transformer's `ioi_dataset.py`, kept
in ACDC's repository as `acdc/ioi/ioi_dataset.py`). ACDC uses one template, so that every prompt is
of one length; so do we, both orders of it.
"""
from __future__ import annotations

import numpy as np

TEMPLATES = {"BABA": "Then, {S} and {IO} went to the {PLACE}. {S} gave a {OBJECT} to",
             "ABBA": "Then, {IO} and {S} went to the {PLACE}. {S} gave a {OBJECT} to"}
PLACES = ("store", "garden", "restaurant", "school", "hospital", "office", "house", "station")
OBJECTS = ("ring", "kiss", "bone", "basketball", "computer", "necklace", "drink", "snack")
NAMES = ("Michael", "Christopher", "Jessica", "Matthew", "Ashley", "Jennifer", "Joshua", "Amanda", "Daniel",
         "David", "James", "Robert", "John", "Joseph", "Andrew", "Ryan", "Brandon", "Jason", "Justin", "Sarah",
         "William", "Jonathan", "Stephanie", "Brian", "Nicole", "Nicholas", "Anthony", "Heather", "Eric",
         "Elizabeth", "Adam", "Megan", "Melissa", "Kevin", "Steven", "Thomas", "Timothy", "Christina", "Kyle",
         "Rachel", "Laura", "Lauren", "Amber", "Brittany", "Danielle", "Richard", "Kimberly", "Jeffrey", "Amy",
         "Crystal", "Michelle", "Tiffany", "Jeremy", "Benjamin", "Mark", "Emily", "Aaron", "Charles", "Rebecca",
         "Jacob", "Stephen", "Patrick", "Sean", "Erin", "Jamie", "Kelly", "Samantha", "Nathan", "Sara", "Dustin",
         "Paul", "Angela", "Tyler", "Scott", "Katherine", "Andrea", "Gregory", "Erica", "Mary", "Travis", "Lisa",
         "Kenneth", "Bryan", "Lindsey", "Kristen", "Jose", "Alexander", "Jesse", "Katie", "Lindsay", "Shannon",
         "Vanessa", "Courtney", "Christine", "Alicia", "Cody", "Allison", "Bradley", "Samuel")


def prompts(n: int, seed: int = 0) -> list[dict]:
    """`n` prompts, half BABA and half ABBA: each with its text, its corrupted text (the IO, the first and
    the second S each another name, all five names distinct), and its IO and S names."""
    draw = np.random.default_rng(seed)
    out = []
    for i in range(n):
        io, s, x, y, z = (str(name) for name in draw.choice(NAMES, 5, replace=False))
        place, thing = str(draw.choice(PLACES)), str(draw.choice(OBJECTS))
        form = ("BABA", "ABBA")[i % 2]
        two = TEMPLATES[form].replace("{S}", "{S1}", 1).replace("{S}", "{S2}", 1)    # S's two mentions apart
        text = two.format(IO=io, S1=s, S2=s, PLACE=place, OBJECT=thing)
        corrupted = two.format(IO=x, S1=z, S2=y, PLACE=place, OBJECT=thing)
        out.append({"text": text, "corrupted": corrupted, "io": io, "s": s, "form": form})
    return out


def words(text: str) -> list[str]:
    """A text as words and punctuation, each with the space before it, as GPT-2's pre-tokenizer cuts."""
    out, word = [], ""
    for ch in text:
        if ch in ",.":
            out += [word, ch] if word else [ch]
            word = ""
        elif ch == " ":
            if word:
                out.append(word)
            word = " "
        else:
            word += ch
    return out + ([word] if word else [])
