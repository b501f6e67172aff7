"""What a CI leg ran on, recorded by the leg itself: `.ci/run` calls this after each leg's pytest.

    python tools/ci_legs.py LEG LOG "COMMAND"     # writes .ci/logs/LEG.json

The record holds the leg's Python, the versions of jax and of what it runs with (torch where the
oracles are installed), the test command and pytest's closing line, read from the leg's log.
Copied into docs/ci/ and committed (`cp .ci/logs/*.json docs/ci/`), `python -m experiments.pages`
puts the records in README.md and docs/install.md, so the versions those pages name are the ones
a run used, never typed. (Written beside the logs, not into docs/: a later leg's suite checks
the pages against docs/ci/.)
"""
from __future__ import annotations

import importlib.metadata
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDER = ROOT / ".ci" / "logs"
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "ml_dtypes", "torch")
LEGS = {"whole_suite": "Python 3.11, the whole suite with the oracles (torch, transformers, TransformerLens)",
        "newest_jax": "Python 3.12, the newest jax and flax that pip resolves, the fast tier and every experiment's "
                      "smoke preset, on the base install; the oracles' tests skip"}


def version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def closing_line(log: str) -> str | None:
    """pytest's summary, "700 passed, 13 skipped in 41.2s", without its '=' rule and colours; None when
    the log has none (pytest cut short, or another command's output)."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip("= \n") for line in log.splitlines()]
    found = [line for line in lines if re.search(r"\b(passed|failed|error|errors|no tests ran)\b.* in [0-9.]+s", line)]
    return found[-1] if found else None


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in LEGS:
        print(f"usage: python tools/ci_legs.py {{{','.join(LEGS)}}} LOG COMMAND", file=sys.stderr)
        return 2
    leg, log, command = argv
    # A record without pytest's closing line would put a run that never finished into README: none is written.
    try:
        summary = closing_line(pathlib.Path(log).read_text(encoding="utf-8", errors="replace"))
    except OSError as e:
        print(f"error: cannot read the leg's log {log} ({e.strerror or e}); give the file pytest's output went to, "
              f"nothing recorded", file=sys.stderr)
        return 2
    if summary is None:
        print(f"error: {log} holds no pytest summary line (\"N passed ... in Ts\"): the run was cut short or the log "
              f"is another command's; run the leg's pytest again into it, nothing recorded", file=sys.stderr)
        return 2
    record = {"leg": leg, "what": LEGS[leg], "python": sys.version.split()[0], "command": command,
              "pytest": summary, "versions": {name: version(name) for name in PACKAGES}}
    FOLDER.mkdir(parents=True, exist_ok=True)
    (FOLDER / f"{leg}.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"recorded {leg}: Python {record['python']}, jax {record['versions']['jax']}: {record['pytest']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
