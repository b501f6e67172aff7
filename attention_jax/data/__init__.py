"""Corpus, tokens and batches: everything between the text file and a model's input.

Pipeline, as the experiments use it:

    path = resolve_corpus(args.data)            # verified tinyshakespeare.txt
    tokens = load_tokens(path, vocab_size=1024)  # int32 ids, trained/encoded once, cached
    train, val = train_val_split(tokens)         # first 90% / last 10%
    x, y = get_batch(train, seed=0, step=k, batch_size=64, context=128)
    xv, yv = eval_windows(val, 128)              # whole held-out split, non-overlapping

Where the corpus comes from, first match wins (each copy is checked against
CORPUS_SHA256; a mismatch is an error, never a warning):

    1. the `path` argument (the experiments' `--data PATH`): a file, or a folder
       holding tinyshakespeare.txt;
    2. $ATTENTION_JAX_DATA, a folder holding tinyshakespeare.txt;
    3. cache_dir()/tinyshakespeare.txt;
    4. a download of CORPUS_URL into that cache path (skipped with download=False).

Cache layout (cache_dir() is $ATTENTION_JAX_CACHE, else $XDG_CACHE_HOME/attention_jax,
else ~/.cache/attention_jax):

    tinyshakespeare.txt
    bpe-<first 16 hex of the corpus sha256>-v<vocab>/tokenizer.json
    bpe-<first 16 hex of the corpus sha256>-v<vocab>/tokens.npy
    jax-compilation/   (the experiments' compiled programs: experiments.harness.compile_cache)

Deleting the cache folder is always safe: everything in it is rebuilt on demand.

The submodules are split by what they touch: `corpus` the file system and network,
`tokenizer` the BPE and its on-disk cache, `batches` only arrays (pure, no I/O).
Re-exporting here gives callers one stable import path regardless of that split.
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
