"""The process room's place in the layers: `sandbox/process/` is the lowest room, so it imports
nothing of Warren's outside `sandbox/` (and of `sandbox/` only the zygote's namespace steps),
nothing but the standard library, trio and psutil besides; the modules a worker and the zygote
import before `workers.lean` defers trio's imports load neither trio nor subprocess; and no
module of `sandbox/` imports another that imports it back."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
ROOM = ROOT / "sandbox" / "process"


def _imports(path: Path, *, top_level_only: bool = False) -> set[str]:
    """Every module `path` imports: at its top, in functions, under TYPE_CHECKING."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_room_imports_only_the_stdlib_trio_psutil_and_sandbox() -> None:
    allowed = set(sys.stdlib_module_names) | {"trio", "psutil", "sandbox"}
    for path in ROOM.glob("*.py"):
        for name in _imports(path):
            top = name.split(".")[0]
            assert top in allowed, f"{path.name} imports {name}"
            if top == "sandbox":
                assert name.startswith(("sandbox.process", "sandbox.nsfork")) or name in (
                    "sandbox",
                ), f"{path.name} imports {name}, above the room"


def test_what_the_zygote_imports_early_loads_neither_trio_nor_subprocess() -> None:
    for name in ("handover.py", "zygote.py"):
        top = {n.split(".")[0] for n in _imports(ROOM / name, top_level_only=True)}
        assert not {"trio", "subprocess"} & top, name


def test_no_import_circle_in_the_sandbox_package() -> None:
    # Not the package itself: every submodule's import passes through it, and it loads its
    # names lazily (sandbox/__init__.py).
    modules = {_module(p): p for p in (ROOT / "sandbox").rglob("*.py") if _module(p) != "sandbox"}
    edges = {
        name: {m for m in modules if m != name and m in _imports(path)}
        for name, path in modules.items()
    }

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            current = todo.pop()
            for nxt in edges[current] - seen:
                if nxt == goal:
                    return True
                seen.add(nxt)
                todo.append(nxt)
        return False

    circles = sorted((a, b) for a in edges for b in edges[a] if a < b and reaches(b, a))
    assert circles == []
