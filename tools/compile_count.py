"""How many XLA programs each test file compiles, and the seconds XLA spends compiling them.

A pytest plugin (a jax.monitoring listener on backend compiles), for finding what a cold suite
spends its compile time on. Each process (each xdist worker) writes <dir>/<worker>.json; this
file run as a script prints them as one table:

    rm -rf .cache /tmp/compiles
    COMPILE_COUNT_DIR=/tmp/compiles PYTHONPATH=tools python -m pytest -q -n 2 --dist loadfile -p compile_count
    python tools/compile_count.py /tmp/compiles

COMPILE_COUNT_BY=test counts per test instead of per file. A program served from the persistent
compilation cache is not compiled, so clear the cache first to see a cold run's compiles. The
processes tests start (the notebook's kernel, the multi-process tests) are not counted.
"""

import collections
import json
import os
import pathlib
import sys

import pytest

_NOW = {"key": "<collection>"}
_COUNT, _SECONDS = collections.Counter(), collections.Counter()


def pytest_configure(config):
    import jax.monitoring

    def on_event(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            _COUNT[_NOW["key"]] += 1
            _SECONDS[_NOW["key"]] += duration
    jax.monitoring.register_event_duration_secs_listener(on_event)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _NOW["key"] = item.nodeid if os.environ.get("COMPILE_COUNT_BY") == "test" else item.path.name
    yield


def pytest_unconfigure(config):
    folder = pathlib.Path(os.environ.get("COMPILE_COUNT_DIR", "compile_count"))
    folder.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    (folder / f"{worker}.json").write_text(json.dumps({"count": _COUNT, "seconds": _SECONDS}))


def main(folder: str) -> None:
    count, seconds = collections.Counter(), collections.Counter()
    for path in sorted(pathlib.Path(folder).glob("*.json")):
        data = json.loads(path.read_text())
        count.update(data["count"])
        seconds.update(data["seconds"])
    print(f"{sum(count.values())} programs compiled in {sum(seconds.values()):.1f} s")
    for key, s in seconds.most_common():
        print(f"{s:8.1f} s {count[key]:6d}  {key}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "compile_count")
