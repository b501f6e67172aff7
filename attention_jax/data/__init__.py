"""Corpus, tokens and batches: everything between the text file and a model's input.

    path = resolve_corpus()                      # tinyshakespeare.txt, sha256-checked
    tokens = load_tokens(path, vocab_size=1024)  # int32 ids, trained and encoded once, cached
    train, val = train_val_split(tokens)         # first 90% / last 10%
    x, y = get_batch(train, seed=0, step=k, batch_size=64, context=128)
    xv, yv = eval_windows(val, 128)              # the whole held-out split, non-overlapping

The corpus comes from the path given, else $ATTENTION_JAX_DATA (as the path: the file or a
folder holding it), else the user cache (`cache_dir()`: $ATTENTION_JAX_CACHE, else
$XDG_CACHE_HOME/attention_jax, else ~/.cache/attention_jax), else a download; every copy is
checked against CORPUS_SHA256. The cache also keeps each corpus's BPE and ids
(`bpe-<corpus hash>-v<vocab>/`); deleting it is always safe. `corpus` touches the file system
and network, `tokenizer` the BPE and its cache, `batches` only arrays.
"""

from attention_jax.data.batches import eval_windows, get_batch, train_val_split
from attention_jax.data.corpus import (
    CORPUS_NAME,
    CORPUS_SHA256,
    CORPUS_URL,
    cache_dir,
    resolve_corpus,
    sha256_file,
)
from attention_jax.data.tokenizer import load_tokenizer, load_tokens

__all__ = [
    "CORPUS_NAME",
    "CORPUS_SHA256",
    "CORPUS_URL",
    "cache_dir",
    "eval_windows",
    "get_batch",
    "load_tokenizer",
    "load_tokens",
    "resolve_corpus",
    "sha256_file",
    "train_val_split",
]
