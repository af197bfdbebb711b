"""A workflow script's `META`, read before anything of the script runs.

A workflow is a plain Python script that begins with a module-level literal,

    META = {"name": "review", "description": "...", "phases": ["Review", "Verify"]}

which the Workflow tool shows when it asks the user, and which names the run. It is read with
`ast` and `ast.literal_eval` only: nothing the model wrote is executed on the coordinator
(the script itself runs later, in its own sandbox: `orchestrator.workflows.script`).

The rule is the simplest that a reader can check by eye: `META = {...}` is the first statement
of the script, after an optional docstring (and `from __future__` imports, which Python itself
requires to come first). A script written in Claude Code's JavaScript form (`export const meta
= {...}`) is refused with a message that shows the Python form, since a model that knows the
other dialect is the likeliest author of that mistake.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from orchestrator.errors import WarrenError

__all__ = ["PYTHON_FORM", "WorkflowError", "WorkflowMeta", "read_meta"]

PYTHON_FORM = """\
META = {"name": "review", "description": "Review each package, then verify the findings", \
"phases": ["Review", "Verify"]}
phase("Review")
found = parallel([lambda p=p: agent(f"Review {p}", schema=FINDINGS) for p in args["packages"]])
finish([f for f in found if f])"""
"""A workflow script in Warren's form, shown to whoever wrote another one."""

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
"""A workflow's name: what `warren workflow run NAME` and a saved `NAME.py` spell."""
_JAVASCRIPT = re.compile(
    r"^\s*(?:export|const|let)\s|\bawait\s+(?:agent|parallel|pipeline)\s*\(", re.MULTILINE
)
"""Tell-tales of Claude Code's JavaScript workflows, looked for only in a script that is not
valid Python (a Python script cannot have them outside strings and comments)."""
_KEYS = frozenset({"name", "description", "phases"})


class WorkflowError(WarrenError):
    """A workflow script that cannot run: no `META`, a `META` of the wrong shape, a syntax
    error, JavaScript. `message` says what to change (it goes to the model verbatim);
    `line` is the script's line when one is to blame."""

    def __init__(self, message: str, *, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


@dataclass(frozen=True)
class WorkflowMeta:
    """What a workflow says of itself: its name, a description for the user, its phases in
    order (for the progress display; the script may announce others)."""

    name: str
    description: str
    phases: tuple[str, ...] = ()


def read_meta(source: str) -> WorkflowMeta:
    """The `META` of `source`, read without running anything.

    **Errors:** `WorkflowError` for JavaScript (with the Python form), a syntax error (its
    line and message), a missing or misplaced `META`, one that is not a literal, or one of the
    wrong shape (a non-empty name of letters, digits, `_` and `-`; a description; phases a
    list of strings; no other keys).
    """
    try:
        module = ast.parse(source, filename="<workflow>")
    except SyntaxError as exc:
        if _JAVASCRIPT.search(source):
            raise WorkflowError(
                "This workflow script is JavaScript; Warren runs workflow scripts written in "
                "Python: a module-level META literal first, then plain synchronous calls of "
                "agent(), parallel(), pipeline(), phase(), log() and finish(), with args "
                "holding the arguments. For example:\n" + PYTHON_FORM
            ) from None
        raise WorkflowError(
            f"The workflow script has a syntax error at line {exc.lineno}: {exc.msg}",
            line=exc.lineno,
        ) from None
    node = _meta_node(module)
    try:
        value = ast.literal_eval(node.value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise WorkflowError(
            f"META (line {node.lineno}) must be a literal: it is read before the script runs, "
            "so it can hold only strings, numbers, lists and dicts, nothing computed",
            line=node.lineno,
        ) from None
    return _checked(value, node.lineno)


def _meta_node(module: ast.Module) -> ast.Assign:
    """The `META = ...` statement, which must come first."""
    body = list(module.body)
    if body and _is_docstring(body[0]):
        body.pop(0)
    while body and isinstance(body[0], ast.ImportFrom) and body[0].module == "__future__":
        body.pop(0)
    if body and _assigns_meta(body[0]):
        first = body[0]
        assert isinstance(first, ast.Assign)
        return first
    elsewhere = next((stmt for stmt in body if _assigns_meta(stmt)), None)
    if elsewhere is not None:
        raise WorkflowError(
            f"META (line {elsewhere.lineno}) must be the script's first statement (after an "
            "optional docstring), before any other code",
            line=elsewhere.lineno,
        )
    raise WorkflowError(
        "A workflow script must begin with a META literal, for example:\n"
        'META = {"name": "review", "description": "what it does", "phases": ["Review"]}'
    )


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _assigns_meta(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
        and stmt.targets[0].id == "META"
    )


def _checked(value: object, line: int) -> WorkflowMeta:
    def wrong(what: str) -> WorkflowError:
        return WorkflowError(f"META (line {line}): {what}", line=line)

    if not isinstance(value, dict):
        raise wrong(f"must be a dict, not {type(value).__name__}")
    unknown = sorted(str(key) for key in value if key not in _KEYS)
    if unknown:
        keys = ", ".join(map(repr, unknown))
        raise wrong(f"unknown key {keys}; it takes name, description and phases")
    name = value.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise wrong(
            "name must be a string of up to 64 letters, digits, '_' and '-', starting with a "
            f"letter (got {name!r})"
        )
    description = value.get("description")
    if not isinstance(description, str):
        raise wrong(f"description must be a string (got {description!r})")
    phases = value.get("phases", [])
    if not isinstance(phases, list | tuple) or not all(isinstance(p, str) for p in phases):
        raise wrong(f"phases must be a list of strings (got {phases!r})")
    return WorkflowMeta(name=name, description=description, phases=tuple(phases))
