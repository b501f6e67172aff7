"""The library apart from the lab: what `import attention_jax` pulls in, and how its files (and the lab's) are kept."""
import ast
import importlib.util
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "attention_jax"
SOURCES = sorted(LIBRARY.rglob("*.py"))
LAB = sorted((ROOT / "experiments").rglob("*.py"))
# The lab's tools: plotting, the torch oracle, the command line and allocator tuning.
LAB_ONLY = {"matplotlib", "torch", "experiments", "argparse", "ctypes", "signal"}


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_no_library_file_imports_the_lab_or_its_tools():
    offenders = {p.relative_to(ROOT).as_posix(): sorted(_imports(p) & LAB_ONLY) for p in SOURCES}
    assert {p: names for p, names in offenders.items() if names} == {}


@pytest.mark.slow
def test_importing_every_library_module_loads_no_matplotlib_torch_or_lab_code():
    code = ("import importlib, pkgutil, sys, attention_jax\n"
            "for m in pkgutil.walk_packages(attention_jax.__path__, 'attention_jax.'):\n"
            "    importlib.import_module(m.name)\n"
            "print(sorted({n.split('.')[0] for n in sys.modules} & {'matplotlib', 'torch', 'experiments'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None,
                    reason="ruff is not installed (pip install -e '.[check]')")
def test_every_library_line_is_at_most_100_characters():
    """Every library line at most 100 characters, as ruff's E501 counts them (pyproject.toml's
    [tool.ruff] sets the same line-length for ruff run by hand)."""
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "E501",
                          "--line-length", "100", "--output-format", "concise", "attention_jax"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, "lines over 100 characters:\n" + out.stdout + out.stderr


def test_the_library_s_largest_file_is_at_most_350_lines():
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text(encoding="utf-8").splitlines()) for p in SOURCES}
    assert max(sizes.values()) <= 350, max(sizes, key=sizes.get)


def test_every_library_module_has_a_test_file_of_its_own():
    """attention_jax/x.py -> tests/test_x.py; attention_jax/pkg/x.py -> tests/test_pkg_x.py."""
    expected = {}
    for p in SOURCES:
        parts = p.relative_to(LIBRARY).with_suffix("").parts
        if parts[-1] == "__init__" or parts == ("errors",):
            continue
        expected[p.relative_to(ROOT).as_posix()] = "test_" + "_".join(parts) + ".py"
    missing = {src: test for src, test in expected.items() if not (ROOT / "tests" / test).is_file()}
    assert missing == {}


def _strings(path: pathlib.Path):
    """(line, text) of every string constant in a file, docstrings included."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def test_no_library_string_names_a_command_line_flag():
    """The library speaks of values and its own API; the lab adds its flags where it catches an error."""
    import re
    flag = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]+")
    found = {f"{p.relative_to(ROOT).as_posix()}:{line}": flag.findall(text)
             for p in SOURCES for line, text in _strings(p) if flag.search(text)}
    assert found == {}



def _long_functions(sources) -> dict[str, int]:
    long = {}
    for p in sources:
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 60:
                    long[f"{p.relative_to(ROOT).as_posix()}:{node.name}"] = lines
    return long


def test_no_library_function_is_over_60_lines():
    assert _long_functions(SOURCES) == {}


def test_no_lab_function_is_over_60_lines():
    """A command's `run` reads as its steps (the flags, the rows or measurements, the tables, the claims),
    each a function of its own."""
    assert _long_functions(LAB) == {}


def _module(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports_among(path: pathlib.Path, modules: set[str]) -> set[str]:
    """The `modules` that `path` imports, at the top or inside a function: `from a.b import c` is a.b.c
    when that is a module, else the module that defines c (a package's lazy exports included)."""
    import importlib
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                defined = getattr(getattr(importlib.import_module(node.module), a.name, None), "__module__", None)
                found.add(full if full in modules else defined if defined in modules else node.module)
    return found & modules


def _cycles(sources) -> list[list[str]]:
    """The import circles among `sources` (function-level imports counted): each set of modules that
    reach one another, sorted (Tarjan's strongly connected components of more than one module)."""
    modules = {_module(p): p for p in sources}
    graph = {m: _imports_among(p, set(modules)) - {m} for m, p in modules.items()}
    order, low, stack, circles = {}, {}, [], []

    def visit(m):
        order[m] = low[m] = len(order)
        stack.append(m)
        for n in sorted(graph[m]):
            if n not in order:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], order[n])
        if low[m] == order[m]:          # m heads a component: everything above it on the stack
            component = stack[stack.index(m):]
            del stack[stack.index(m):]
            if len(component) > 1:
                circles.append(sorted(component))
    for m in sorted(graph):
        if m not in order:
            visit(m)
    return circles


def test_no_library_module_imports_one_that_imports_it_back_lazily_or_not():
    """The import graph, function-level imports counted, has no cycle: each layer sits below the next."""
    assert _cycles(SOURCES) == []


def test_no_lab_module_imports_one_that_imports_it_back_lazily_or_not():
    """The lab's too: a name two modules share lives in the one below both (a package's constants, the
    harness), never in a module that imports the other back inside a function."""
    assert _cycles(LAB) == []
