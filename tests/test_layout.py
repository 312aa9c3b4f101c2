"""The package's shape: imports run one way, modules stay small, each layer imports only what is below it."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "allreduce_edu"
GENERATED = {"_proto/rank_pb2.py", "_proto/rank_pb2_grpc.py"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
GENERATED_MODULES = {_module_name(PACKAGE / g) for g in GENERATED}


@functools.cache
def parsed(name: str) -> ast.Module:
    """Module `name`, parsed once for every test here."""
    return ast.parse(MODULES[name].read_text())


def imports(name: str) -> set[str]:
    """Every module of the package that `name` imports, at any depth of its code (function-level too)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(parsed(name)):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                found.add(candidate if candidate in MODULES else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in MODULES and m != name}


def test_no_import_cycle_inside_the_package():
    graph = {name: imports(name) for name in MODULES}
    visiting, done, cycle = set(), set(), []

    def visit(name, path):
        if name in done or cycle:
            return
        if name in visiting:
            cycle.extend(path[path.index(name):] + [name])
            return
        visiting.add(name)
        for dep in sorted(graph[name]):
            # a package's __init__ importing its own submodules is how packages work, not a cycle
            if not dep.startswith(name + ".") and not name.startswith(dep + "."):
                visit(dep, path + [name])
        visiting.discard(name)
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    assert not cycle, " → ".join(cycle)


# The layers, bottom first: the only layering rule. A module imports modules of its own unit (the
# folder or top-level file named here) and of lower layers, never of a peer in its own layer.
LAYERS = [
    ("ops", "trace", "version", "_proto"),    # leaves: the op table, message events, generated stubs
    ("model",),                               # costmodel, portsim, links (the emulated network), tuner
    ("kernels", "comm"),                      # what runs on the bytes; how ranks talk (the seam, transports)
    ("collectives", "runtime"),               # the algorithms (+ fused); where ranks live
    ("training", "viz", "bench"),             # what the all-reduce is for; pictures; measurements
    ("exercises",),                           # the checkers
    ("course",),                              # the lessons as files, hide_answers, extras, the site
    ("cli", "notebook", "__init__"),          # the faces: command line, lesson helpers, public API
]
LAYER = {unit: depth for depth, units in enumerate(LAYERS) for unit in units}


def unit(name: str) -> str:
    """`allreduce_edu.comm.transports.shm.link` -> `comm`; the package itself -> `__init__`."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_the_top_of_the_package_is_six_files_and_the_layer_folders():
    files = sorted(p.name for p in PACKAGE.glob("*.py"))
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert files == ["__init__.py", "cli.py", "notebook.py", "ops.py", "trace.py", "version.py"], files
    assert set(folders) <= set(LAYER), f"folders outside the layer table: {set(folders) - set(LAYER)}"
    assert {unit(name) for name in MODULES} <= set(LAYER)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_each_module_imports_only_its_own_unit_and_lower_layers(name):
    mine = unit(name)
    wrong = sorted(m for m in imports(name) if unit(m) != mine and LAYER[unit(m)] >= LAYER[mine])
    assert not wrong, (f"{name} (layer {LAYER[mine]}, {mine}) imports " + ", ".join(
        f"{m} (layer {LAYER[unit(m)]}{', a peer' if LAYER[unit(m)] == LAYER[mine] else ', above'})"
        for m in wrong))


@pytest.mark.parametrize("name", sorted(MODULES))
def test_hand_written_modules_stay_under_300_lines(name):
    path = MODULES[name]
    if str(path.relative_to(PACKAGE)) in GENERATED:
        return
    lines = len(path.read_text().splitlines())
    assert lines <= 300, f"{path.relative_to(PACKAGE.parent)} has {lines} lines: split it by idea"


def test_torch_is_imported_only_where_it_is_used():
    """The exercise registry loads every lesson's module and `allreduce_edu.training.pytorch` is
    imported to ask whether torch is there: neither may need torch at import time."""
    for name in ("allreduce_edu.training.pytorch", "allreduce_edu.exercises.lesson13"):
        top = [n for n in parsed(name).body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = {a.name for n in top for a in n.names} | {n.module or "" for n in top if isinstance(n, ast.ImportFrom)}
        assert not any(m == "torch" or m.startswith("torch.") for m in names), f"{name} imports torch at module level"


def test_no_module_imports_its_own_package():
    """`from . import x` (or `from ..pkg import x` naming its own package) makes a module need its
    package's __init__, which imports it: a cycle (the top-level modules are the package's layers,
    checked by the cycle test)."""
    for name, path in MODULES.items():
        own = name.rpartition(".")[0]
        if path.name == "__init__.py" or own == "allreduce_edu" or name in GENERATED_MODULES:
            continue
        for node in ast.walk(parsed(name)):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = own.split(".")[:len(own.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            elif isinstance(node, ast.ImportFrom | ast.Import):
                source = node.module if isinstance(node, ast.ImportFrom) else None
                if source is None:
                    continue
            else:
                continue
            assert source != own, f"{name} imports its own package {own} (line {node.lineno})"


def _private(attr: str) -> bool:
    return attr.startswith("_") and not attr.startswith("__")


def private_names(tree: ast.AST) -> set[str]:
    """The private names a module defines: its own functions, classes, methods, attributes."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
    return {n for n in names if _private(n)}


FRAMEWORK_NAMES = {"_esm", "_css"}  # anywidget's traits: a widget class sets them, anywidget reads them


def test_no_private_attribute_crosses_modules():
    """A module reads and writes only its own private names (comm._mailbox from a transport's
    module, parent._signature from comm/group.py, comm._progress from collectives/ would fail)."""
    trees = {name: parsed(name) for name, path in MODULES.items()
             if str(path.relative_to(PACKAGE)) not in GENERATED}
    defined = {name: private_names(tree) for name, tree in trees.items()}
    everywhere = set().union(*defined.values()) - FRAMEWORK_NAMES
    crossing = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and _private(node.attr)
                    and node.attr in everywhere - defined[name]):
                crossing.append(f"{name}:{node.lineno} .{node.attr}")
    assert not crossing, "private names used outside their module: " + ", ".join(crossing)
