"""The library apart from the lab: what `import attention_jax` pulls in, and how its files are kept."""
import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "attention_jax"
SOURCES = sorted(LIBRARY.rglob("*.py"))
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


def test_importing_every_library_module_loads_no_matplotlib_torch_or_lab_code():
    code = ("import importlib, pkgutil, sys, attention_jax\n"
            "for m in pkgutil.walk_packages(attention_jax.__path__, 'attention_jax.'):\n"
            "    importlib.import_module(m.name)\n"
            "print(sorted({n.split('.')[0] for n in sys.modules} & {'matplotlib', 'torch', 'experiments'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_library_s_largest_file_is_at_most_350_lines():
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text(encoding="utf-8").splitlines()) for p in SOURCES}
    assert max(sizes.values()) <= 350, max(sizes, key=sizes.get)
