"""The house's shape, measured from the code's own imports and definitions (no code of it runs).

`tests/test_house.py` holds the rules against it; `python -m tests.kit.house` prints the
numbers. Every import counts: at module level, inside functions and under `TYPE_CHECKING`.

- circles: groups of modules that import each other, directly or round a ring;
- the rooms: `orchestrator/`'s root modules, the front end (`orchestrator/cli/`) that no
  other module imports, the composition root (`orchestrator/cli/wiring.py`) the only module of
  `orchestrator/` that imports `workers/`, and the layers (sandbox < policies < orchestrator <
  workers);
- long functions: any over the limit, by lines from `def` to its last line;
- Claude Code's names: each alias string used as a value in one module only.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sandbox", "policies", "orchestrator", "workers")
FRONT_END = "orchestrator.cli"
COMPOSITION_ROOT = "orchestrator.cli.wiring"
CLAUDE_CODE_NAMES = frozenset({"Task", "Agent", "acceptEdits", "dontAsk", "bypassPermissions"})
"""Claude Code's spellings that differ from Warren's (policies/claude_names.py)."""


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    imports: set[str] = field(default_factory=set)


def modules(root: Path = ROOT) -> dict[str, Module]:
    """Every module of the four packages, with the modules of ours it imports."""
    found: dict[str, Module] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if "sample" in parts:  # the demo's sample repository is data
                continue
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = Module(name, path, ast.parse(path.read_text(), str(path)))
    for module in found.values():
        module.imports = {d for d in _imported(module, found) if d != module.name}
    return found


def _imported(module: Module, known: dict[str, Module]) -> Iterator[str]:
    package = module.name if module.path.name == "__init__.py" else module.name.rpartition(".")[0]
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            # `from a import b`: the module a.b when there is one, else a (b is a name in it).
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                yield name


def circles(found: dict[str, Module]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for start in found:
        if start in index:
            continue
        work = [(start, iter(sorted(found[start].imports)))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(found[target].imports))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
    return groups


def root_modules(root: Path = ROOT) -> list[str]:
    """`orchestrator/`'s root modules besides `__init__.py`."""
    return sorted(p.name for p in (root / "orchestrator").glob("*.py") if p.name != "__init__.py")


def long_functions(found: dict[str, Module], limit: int) -> list[tuple[int, str]]:
    """(lines, `path:line:name`) of each function longer than `limit` lines."""
    out = []
    for module in found.values():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    rel = module.path.relative_to(ROOT)
                    out.append((lines, f"{rel}:{node.lineno}:{node.name}"))
    return sorted(out, reverse=True)


def layer_breaches(found: dict[str, Module]) -> list[str]:
    """Imports against the layering: each package imports only those below it; the engine
    never imports the front end; only the composition root of `orchestrator/` imports
    `workers/`; nothing outside the front end imports it."""
    allowed = {p: set(PACKAGES[: i + 1]) for i, p in enumerate(PACKAGES)}
    breaches = []
    for module in found.values():
        top = module.name.split(".")[0]
        for target in sorted(module.imports):
            target_top = target.split(".")[0]
            front = target == FRONT_END or target.startswith(FRONT_END + ".")
            in_front = module.name == FRONT_END or module.name.startswith(FRONT_END + ".")
            if target_top not in allowed[top] and not (in_front and target_top == "workers"):
                breaches.append(f"{module.name} -> {target} (layers)")
            elif front and not in_front:
                breaches.append(f"{module.name} -> {target} (the engine imports the front end)")
            elif target_top == "workers" and top == "orchestrator" and (
                module.name != COMPOSITION_ROOT
            ):
                breaches.append(f"{module.name} -> {target} (only the composition root)")
    return breaches


def claude_code_names(found: dict[str, Module]) -> dict[str, list[str]]:
    """Each of Claude Code's differing spellings -> the modules that use it as a value."""
    where: dict[str, set[str]] = {}
    for module in found.values():
        exported = {
            id(item)
            for node in module.tree.body
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
            for item in ast.walk(node.value)
        }  # `__all__` names Python objects (a class `Task`), not Claude Code's spellings
        for node in ast.walk(module.tree):
            if id(node) in exported:
                continue
            if isinstance(node, ast.Constant) and node.value in CLAUDE_CODE_NAMES:
                where.setdefault(node.value, set()).add(module.name)
    return {name: sorted(mods) for name, mods in sorted(where.items())}


def main() -> int:
    found = modules()
    print(f"modules: {len(found)}")
    print(f"circles: {len(circles(found))}")
    for group in circles(found):
        print("  " + " <-> ".join(group))
    roots = root_modules()
    print(f"orchestrator/ root modules: {len(roots)} ({', '.join(roots)})")
    long = long_functions(found, 150)
    print(f"functions over 150 lines: {len(long)}")
    for lines, where in long:
        print(f"  {lines} {where}")
    breaches = layer_breaches(found)
    print(f"layer breaches: {len(breaches)}")
    for breach in breaches:
        print(f"  {breach}")
    print("Claude Code's spellings, by module:")
    for name, mods in claude_code_names(found).items():
        print(f"  {name}: {', '.join(mods)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
