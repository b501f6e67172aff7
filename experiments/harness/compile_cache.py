"""Compiled programs kept between runs: JAX's persistent compilation cache, for every experiment.

`enable()` (called by every experiment before it compiles anything) points JAX's cache at
<cache folder>/jax-compilation, so a later run loads the programs XLA compiled instead of
compiling them again; the settings also go into the environment, so the processes a run
starts share the cache. ATTENTION_JAX_COMPILE_CACHE=0 turns it off; a JAX_COMPILATION_CACHE_DIR
of the user's own is used as it is. Only the command line and the notebook turn it on:
importing the library changes nothing in JAX. JAX's size cap is not set (its eviction fails
once the folder holds an entry written without the cap); the folder is small and always
safe to delete. docs/performance.md has what the cache saves.

A damaged entry (a run killed while JAX wrote it) would otherwise stay damaged: JAX warns
that it cannot read it, compiles again, and does not replace a file that exists. In our
folder that warning removes the program's entries that no longer decompress, says so in
one line, and this run's fresh compile is kept in their place.
"""
from __future__ import annotations

import glob
import os
import re
import sys
import warnings

ENV = "ATTENTION_JAX_COMPILE_CACHE"   # "0" turns the cache off
# JAX keeps only programs that took at least a second to compile (its default): on a CPU,
# none of ours. A tenth of a second keeps the training steps and the analyses' forward passes
# and leaves out the single ops run eagerly (keeping every program was no faster).
MIN_COMPILE_SECONDS = 0.1
# What JAX warns (jax/_src/compiler.py) when an entry cannot be read: a program's name or its key.
UNREADABLE = re.compile(r"Error reading persistent compilation cache entry for '([^'/]+)'")
_ours: str | None = None    # the folder this process chose (not the user's JAX_COMPILATION_CACHE_DIR)


def settings() -> dict:
    """The jax.config settings that turn the cache on, or {} to leave JAX's own choice.

    JAX's own variable for the threshold wins over ours.
    """
    if os.environ.get(ENV, "").strip() == "0" or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return {}
    from attention_jax.data.corpus import cache_location
    chosen = {"jax_compilation_cache_dir": os.path.abspath(cache_location() / "jax-compilation")}
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        chosen["jax_persistent_cache_min_compile_time_secs"] = MIN_COMPILE_SECONDS
    return chosen


def enable() -> str | None:
    """Turn the cache on for this process (before its first compile); the folder in use, or None.

    A folder that cannot be created or written leaves the cache off (it only saves time; JAX
    would warn about every program it failed to keep). Imports JAX.
    """
    global _ours
    import jax
    chosen = settings()
    if chosen and not jax.config.jax_compilation_cache_dir:
        folder = chosen["jax_compilation_cache_dir"]
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError:
            return None
        if not os.access(folder, os.W_OK | os.X_OK):
            return None
        for name, value in chosen.items():
            jax.config.update(name, value)
            # and through the environment, so the processes a run starts (the benchmark's
            # contestants, the complexity table's rows) share it
            os.environ.setdefault(name.upper(), str(value))
        _ours = folder
    folder = in_use()
    if folder and folder == _ours:
        _remove_what_cannot_be_read(folder)
    return folder


def in_use() -> str | None:
    """The cache's folder, or None when JAX keeps no compiled programs (imports JAX)."""
    import jax
    return jax.config.jax_compilation_cache_dir if jax.config.jax_enable_compilation_cache else None


def describe(folder: str) -> str:
    """The line a run prints about the cache it uses."""
    if folder == _ours:
        return f"compiled programs: kept in {folder} for the next run ({ENV}=0: off)"
    return f"compiled programs: kept in {folder} (JAX_COMPILATION_CACHE_DIR)"


def _damaged(path: str) -> bool:
    """Whether a cache entry no longer decompresses (as a write cut short leaves it)."""
    try:
        from jax._src.compilation_cache import decompress_executable
        with open(path, "rb") as f:
            data = f.read()
    except (ImportError, OSError):     # another JAX, or the file is gone: nothing to judge
        return False
    try:
        decompress_executable(data)
        return False
    except Exception:
        return True


def remove_damaged(folder: str, name: str) -> int:
    """Delete the entries of one program (JAX names them <program>-<hash>-cache) that no longer
    decompress, with their -atime files; how many went."""
    removed = 0
    for path in glob.glob(os.path.join(glob.escape(folder), f"{glob.escape(name)}-*-cache")):
        if _damaged(path):
            try:
                os.remove(path)
                removed += 1
                os.remove(path[:-len("-cache")] + "-atime")
            except OSError:
                pass
    return removed


def _remove_what_cannot_be_read(folder: str) -> None:
    """Have JAX's warning about a damaged entry remove it (module docstring); other warnings pass."""
    shown = warnings.showwarning
    if getattr(shown, "heals_compile_cache", None) == folder:
        return

    def showwarning(message, category, filename, lineno, file=None, line=None):
        found = UNREADABLE.search(str(message))
        removed = remove_damaged(folder, found.group(1)) if found else 0
        if not removed:
            return shown(message, category, filename, lineno, file, line)
        print(f"compiled programs: {removed} damaged entr{'y' if removed == 1 else 'ies'} for "
              f"{found.group(1)!r} removed from {folder}; compiled again, and kept anew", file=sys.stderr, flush=True)

    showwarning.heals_compile_cache = folder
    warnings.showwarning = showwarning
