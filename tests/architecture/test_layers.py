"""The package's layers (docs/architecture.md): data flows one way, and a layer names nothing above
it. formats <- chunker <- codecs <- store <- reader <- fsmodel <- daemon, with the shared helpers
below them all and the commands (cli, admin, doctor, inspect, ...) on top. Every import in every
module is read, those inside functions too, so a late import cannot hide a cycle."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import lmzfs

PACKAGE = Path(lmzfs.__file__).parent

# what each first-level name under lmzfs is, from the bottom up; a name not listed is a command
# (rank TOP), which may import anything
BASE = 0
RANKS = {
    **dict.fromkeys(("errors", "counters", "hostresources", "preadio", "printable", "killpoints",
                     "workpool", "malloc", "progress", "mountinfo"), BASE),
    "formats": 1,
    "chunker": 2,
    "codecs": 3,
    "store": 4,
    "reader": 5,
    "fsmodel": 6,
    "daemon": 7,
}
TOP = 8


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, int]]:
    """(module imported, line) of every lmzfs import in the file, relative ones resolved."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            # `from lmzfs import store` names the subpackage itself
            out += [(f"{name}.{alias.name}" if name == "lmzfs" else name, node.lineno) for alias in node.names]
    return [(name, line) for name, line in out if name == "lmzfs" or name.startswith("lmzfs.")]


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_no_module_imports_a_layer_above_its_own(path: Path):
    own = RANKS.get(_layer(_module_name(path)), TOP)
    upward = [f"line {line}: {name}" for name, line in _imports(path)
              if RANKS.get(_layer(name), TOP) > own]
    assert upward == [], f"{path.name} ({_layer(_module_name(path)) or 'lmzfs'}) imports upward: {upward}"


def test_the_read_path_names_no_codec():
    """The reader asks the store for plain bytes; which codec made a chunk is the store's business
    (codecs.base's buffer type is all it may name)."""
    named = [(str(p.relative_to(PACKAGE.parent)), name) for p in (PACKAGE / "reader").rglob("*.py")
             for name, _ in _imports(p) if _layer(name) == "codecs" and name != "lmzfs.codecs.base"]
    assert named == []


def test_every_first_level_name_is_placed_in_a_layer_or_is_a_command():
    """A new package under lmzfs has to be placed: below the store it must be in RANKS."""
    names = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" or (p / "__init__.py").exists()) and p.name != "__pycache__"}
    commands = names - set(RANKS) - {"__init__", "__main__"}
    assert commands == {"admin", "cli", "config", "doctor", "inspect", "mountstats", "remotecheck",
                        "remotecli", "servicecli", "singlefile", "testing"}
