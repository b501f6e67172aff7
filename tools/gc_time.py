"""Seconds each pytest process spends in Python's cyclic garbage collector, by generation.

A pytest plugin (a `gc.callbacks` timer), for checking what tests/conftest.py's freezing of the
heap saves. Each process (each xdist worker) writes <dir>/<worker>.json; this file run as a
script prints them:

    GC_TIME_DIR=/tmp/gc PYTHONPATH=tools python -m pytest -q -n 2 --dist loadfile -m "not slow" -p gc_time
    python tools/gc_time.py /tmp/gc

The processes tests start (the notebook's kernel, the multi-process tests) are not counted.
"""

import gc
import json
import os
import pathlib
import resource
import sys
import time

_STARTED = [0.0]
_SECONDS, _COUNT = [0.0, 0.0, 0.0], [0, 0, 0]


def _timer(phase, info):
    if phase == "start":
        _STARTED[0] = time.perf_counter()
    else:
        _SECONDS[info["generation"]] += time.perf_counter() - _STARTED[0]
        _COUNT[info["generation"]] += 1


gc.callbacks.append(_timer)     # at import, so collection's own imports are timed too


def pytest_unconfigure(config):
    folder = pathlib.Path(os.environ.get("GC_TIME_DIR", "gc_time"))
    folder.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    (folder / f"{worker}.json").write_text(json.dumps({"seconds": _SECONDS, "count": _COUNT, "peak_mb": peak_mb}))


def main(folder: str) -> None:
    for path in sorted(pathlib.Path(folder).glob("*.json")):
        data = json.loads(path.read_text())
        by_gen = ", ".join(f"gen {g}: {s:.1f} s x{n}" for g, (s, n) in enumerate(zip(data["seconds"], data["count"])))
        print(f"{path.stem:6s} {sum(data['seconds']):6.1f} s in the collector ({by_gen}); peak RSS {data['peak_mb']:.0f} MB")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gc_time")
