"""The rooms of docs/architecture.md, read from the source: no import circles, and who may import what."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "deepdanbooru"
STANDARD_LIBRARY_ROOMS = ("project", "dataset", "preflight", "runstate")
STANDARD_LIBRARY_MODULES = ("formats", "registry", "models.table", "models.counts")
HEAVY = ("tensorflow", "keras", "numpy")


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """Every module `name` imports, at its top or inside a function."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES)
    return found - {name}


GRAPH = {name: {m for m in _imports(name) if m in MODULES and m != "deepdanbooru"} for name in MODULES}


def test_no_module_imports_one_that_imports_it_back():
    circles = []
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(module):
        state[module] = 1
        path.append(module)
        for imported in sorted(GRAPH[module]):
            if state.get(imported) == 1:
                circles.append(" -> ".join(path[path.index(imported):] + [imported]))
            elif imported not in state:
                visit(imported)
        path.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)
    assert circles == []


def test_scoring_does_not_import_dataset():
    offenders = {name: sorted(m for m in GRAPH[name] if m.startswith("deepdanbooru.dataset"))
                 for name in MODULES if name.startswith("deepdanbooru.scoring")}
    assert {name: found for name, found in offenders.items() if found} == {}


@pytest.mark.parametrize("name", sorted(
    name for name in MODULES
    if name.split(".")[1:2] and (name.split(".")[1] in STANDARD_LIBRARY_ROOMS
                                 or ".".join(name.split(".")[1:]) in STANDARD_LIBRARY_MODULES)))
def test_standard_library_rooms_import_no_tensorflow_keras_or_numpy(name):
    assert not {m for m in _imports(name) if m.split(".")[0] in HEAVY}


def test_sql_is_built_from_its_parts_not_edited_as_text():
    # e.g. sql.replace(" ORDER BY id", ...): a query edited by text silently breaks when its source changes.
    edited = re.compile(r"""(sql|query)\w*\.replace\(|\.replace\(\s*["'](SELECT|\s*ORDER BY|\s*WHERE)""")
    found = [f"{path.relative_to(PACKAGE.parent)}:{number}" for path in MODULES.values()
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
             if edited.search(line)]
    assert found == []
