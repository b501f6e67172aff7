"""How much of a run went into making XLA programs rather than running them.

A first run on a fresh machine traces, lowers and compiles every program it meets (a
table's rows differ in structure, so each row brings its own), and on a GPU or TPU that
can take longer than the training itself. JAX reports each of these phases through
`jax.monitoring`; one listener per process adds them up, and every experiment prints the
sum for its own run and keeps it in results.json (`time`), beside the wall time:

    XLA programs: 21 compiled in 14.2 s (3 of them read from the compile cache); tracing and lowering 2.9 s

A program read back from the persistent compile cache (`compile_cache`) counts among the
programs compiled, with the seconds its reading took.
"""
from __future__ import annotations

import collections

# JAX's event names (jax/_src/dispatch.py, jax/_src/compiler.py)
COMPILE = "/jax/core/compile/backend_compile_duration"
TRACE = "/jax/core/compile/jaxpr_trace_duration"
LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
CACHE_HIT = "/jax/compilation_cache/cache_hits"

_seconds: collections.Counter = collections.Counter()
_counts: collections.Counter = collections.Counter()
_listening = False


def _on_duration(event: str, duration: float, **_) -> None:
    if event in (COMPILE, TRACE, LOWER):
        _seconds[event] += duration
        _counts[event] += 1


def _on_event(event: str, **_) -> None:
    if event == CACHE_HIT:
        _counts[event] += 1


def start() -> tuple[dict, dict]:
    """Listen (once per process) and return the totals so far, for `since` to subtract."""
    global _listening
    if not _listening:
        import jax.monitoring
        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        jax.monitoring.register_event_listener(_on_event)
        _listening = True
    return dict(_seconds), dict(_counts)


def since(mark: tuple[dict, dict]) -> dict:
    """What was made after `mark`: programs compiled (those read from the cache among them) and seconds."""
    seconds, counts = mark
    took = lambda e: _seconds[e] - seconds.get(e, 0.0)
    return {"programs": _counts[COMPILE] - counts.get(COMPILE, 0),
            "from_cache": _counts[CACHE_HIT] - counts.get(CACHE_HIT, 0),
            "compile_s": round(took(COMPILE), 3), "trace_and_lower_s": round(took(TRACE) + took(LOWER), 3)}


def describe(made: dict) -> str:
    """One line; `in_children`: the run measured in processes of its own, whose programs are not counted."""
    if made.get("in_children"):
        return f"XLA programs: {made['programs'] or 'none'} compiled in this process (its measurements compile in their own)"
    cached = f" ({made['from_cache']} of them read from the compile cache)" if made["from_cache"] else ""
    compiled = f"{made['programs']} compiled in {made['compile_s']:.1f} s{cached}" if made["programs"] else "none compiled"
    return f"XLA programs: {compiled}; tracing and lowering {made['trace_and_lower_s']:.1f} s"
