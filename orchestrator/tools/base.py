"""The tool protocol: what every tool carries, and the per-session context tools share.

A tool is one class in one file under `orchestrator/tools/`. It owns its input model, its
read-only and concurrency checks (per call, from the input), its business validation, the call
itself and how it renders for humans. The loop, the executor and the UI never special-case a
tool by name.
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import trio
from pydantic import BaseModel, ConfigDict

from orchestrator.errors import ToolError
from orchestrator.messages import ContentBlock, ImageBlock, TextBlock, ToolResultContent
from policies.facts import ToolFacts

if TYPE_CHECKING:  # a tool host never loads the model's types (tests/workers/test_worker_imports)
    from orchestrator.model.base import ModelRequest

__all__ = [
    "CURRENT_TOOL_USE_ID",
    "CURRENT_TURN",
    "DEFAULT_TOOL_TIMEOUT_S",
    "BlockingTool",
    "Checked",
    "ReadLedger",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolFacts",
    "ToolInput",
    "ToolOutput",
    "ToolProgress",
    "TurnSoFar",
    "input_schema_of",
    "running_for",
]

DEFAULT_TOOL_TIMEOUT_S = 300.0
"""Time limit of a tool call whose tool does not say otherwise (Bash has its own rule)."""

CURRENT_TOOL_USE_ID: ContextVar[str | None] = ContextVar("warren_tool_use_id", default=None)
"""The `tool_use` block a tool call is running for, set by the pipeline around the call
(`running_for`; a context variable: each concurrent call runs in its own task, so each sees its
own). The tool interface is `call(input, ctx)` with a per-session context; `dispatch_agent`
reads this to tie its subagent to the call that started it (stream-json's
`parent_tool_use_id`)."""


@dataclass(frozen=True)
class TurnSoFar:
    """The main agent's turn a tool call runs in: the request that asked for it and the
    blocks of the reply complete so far (by index, live: a call may start before the reply
    has ended)."""

    request: ModelRequest
    blocks: Mapping[int, ContentBlock]


CURRENT_TURN: ContextVar[TurnSoFar | None] = ContextVar("warren_turn", default=None)
"""Set by the loop around a turn's tool calls (`orchestrator/conversation/loop.py`): a fork
(orchestrator/agents/fork.py) starts from the conversation as the model last saw it."""


@contextmanager
def running_for(tool_use_id: str) -> Iterator[None]:
    """`CURRENT_TOOL_USE_ID` is `tool_use_id` inside the block."""
    token = CURRENT_TOOL_USE_ID.set(tool_use_id)
    try:
        yield
    finally:
        CURRENT_TOOL_USE_ID.reset(token)


class ToolInput(BaseModel):
    """Base of every tool's input model: unknown keys are schema errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


InputT = TypeVar("InputT", bound=ToolInput)


@dataclass(frozen=True)
class ToolProgress:
    """A progress note while a call runs (shown to humans, never to the model)."""

    text: str
    data: bytes = b""
    """Output of a call that streams it (a background command's bytes, in order), for the
    caller that keeps it (orchestrator/tasks/shells.py); not shown."""


@dataclass(frozen=True)
class Checked:
    """A runner's first word on a call it was asked to validate as well (`ToolRunner.call`
    with `validate=True`): `refusal` is the validation's message for the model and ends the
    call there (it never ran); None: the call is valid and runs."""

    refusal: str | None = None


@dataclass(frozen=True)
class ToolOutput:
    """The result of a call: content for the model plus an optional short view for humans."""

    content: str | ToolResultContent
    is_error: bool = False
    summary: str | None = None
    """One line for humans; `Tool.render_result` falls back to the first line of content."""

    @classmethod
    def text(cls, text: str, *, summary: str | None = None) -> ToolOutput:
        return cls(content=text, summary=summary)

    @classmethod
    def blocks(
        cls, blocks: list[TextBlock | ImageBlock], *, summary: str | None = None
    ) -> ToolOutput:
        return cls(content=list(blocks), summary=summary)

    def as_text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(b.text for b in self.content if isinstance(b, TextBlock))


class ReadLedger:
    """Read-before-write: when each file was last read (or written) by a tool, by mtime.

    Write, Edit and NotebookEdit refuse a file that is missing here or whose mtime moved since.
    """

    def __init__(self) -> None:
        self._mtimes: dict[Path, int] = {}

    def record(self, path: Path) -> None:
        self._mtimes[path.resolve()] = os.stat(path).st_mtime_ns

    def forget(self, path: Path) -> None:
        self._mtimes.pop(path.resolve(), None)

    def recorded_mtime(self, path: Path) -> int | None:
        return self._mtimes.get(path.resolve())

    def retain(self, paths: set[Path]) -> None:
        """Forget every entry but `paths` (compared as given: the caller normalises them)."""
        for path in [p for p in self._mtimes if p not in paths]:
            del self._mtimes[path]

    def entries(self) -> dict[Path, int]:
        """A copy of every entry (resolved path -> mtime in ns), to ship to a tool host."""
        return dict(self._mtimes)

    def apply(self, recorded: Mapping[Path, int], forgotten: Iterable[Path]) -> None:
        """Take entries made elsewhere (in a sandboxed tool host) as they are.

        The paths were resolved and the mtimes read where the files are; nothing is touched on
        disk here, so the coordinator never reads the workspace on a tool's behalf.
        """
        self._mtimes.update(recorded)
        for path in forgotten:
            self._mtimes.pop(path, None)


T = TypeVar("T")


@dataclass
class ToolContext:
    """Per-session state tools share. Never module globals: two sessions, two contexts.

    `workspace` is the root the agent works in (absolute, resolved); `cwd` is where relative
    things (the shell) start. Session-scoped resources (the persistent shell) are created on
    first use with `resource()` and closed by `aclose()`.
    """

    workspace: Path
    cwd: Path
    session_id: str = "local"
    read_ledger: ReadLedger = field(default_factory=ReadLedger)
    extra_roots: tuple[Path, ...] = ()
    """More directories the agent may work in, besides `workspace`."""
    read_deny: tuple[tuple[str, str], ...] = ()
    """The policy's `Read` deny rules as (path specifier, directory it is anchored at): Read,
    Grep and Glob refuse or leave out what they cover (`read_denied`), including files made
    after the sandbox started, whose masks cover only what existed then."""
    _resources: dict[str, Any] = field(default_factory=dict)

    def roots(self) -> tuple[Path, ...]:
        return (self.workspace, *self.extra_roots)

    def is_inside_roots(self, path: Path) -> bool:
        """True when `path`, resolved (symlinks followed), lies within a root."""
        return self.holds_resolved(path.resolve())

    def holds_resolved(self, resolved: Path) -> bool:
        """True when `resolved` (a path with its links already resolved) lies within a root.

        The roots are resolved once, when first asked, and again only when they change: a
        root swapped for a link later (possible where no sandbox mounts the roots) does not
        move the boundary with it.
        """
        roots = self.roots()
        known = self._resources.get("resolved roots")
        if known is None or known[0] != roots:
            known = (roots, tuple(root.resolve() for root in roots))
            self._resources["resolved roots"] = known
        return any(resolved.is_relative_to(root) for root in known[1])

    def read_denied(self, path: Path | str, *, resolve: bool = True) -> bool:
        """Does a `Read` deny rule cover `path` (relative to `cwd`), as written or (with
        `resolve`, for a path the model gave) with its links resolved?"""
        if not self.read_deny:
            return False
        patterns = self.resource("read_deny", self._read_deny_patterns)
        path = os.fspath(path)
        written = os.path.normpath(path if path[:1] == "/" else os.path.join(self.cwd, path))
        for pattern in patterns:
            if pattern.matches(written):
                return True
        return resolve and any(p.matches(os.path.realpath(written)) for p in patterns)

    def _read_deny_patterns(self) -> list[Any]:
        from policies.rules import compile_path_pattern

        home = Path(os.environ.get("HOME") or Path.home()).resolve()
        return [
            compile_path_pattern(spec, anchor=Path(anchor), workspace=self.workspace, home=home)
            for spec, anchor in self.read_deny
        ]

    def resource(self, key: str, factory: Callable[[], T]) -> T:
        if key not in self._resources:
            self._resources[key] = factory()
        value: T = self._resources[key]
        return value

    async def aclose(self) -> None:
        """Close every resource that has an `aclose` (each bounded by the resource itself)."""
        resources, self._resources = self._resources, {}
        for value in resources.values():
            closer: Callable[[], Awaitable[None]] | None = getattr(value, "aclose", None)
            if closer is not None:
                await closer()


class Tool(Generic[InputT]):
    """Base class of every tool.

    Subclasses set `name`, `input_model` and `description`, and implement `call` as an async
    generator that yields any number of `ToolProgress` and then exactly one `ToolOutput`
    (or raises `ToolError`, whose message is written for the model).
    """

    name: ClassVar[str]
    input_model: ClassVar[type[ToolInput]]
    description: ClassVar[str]
    facts: ClassVar[ToolFacts] = ToolFacts(family="external")
    """What the tool declares about itself for the policy (family, path fields, where it
    runs): every built-in tool sets its own. The default, `external` without paths, is the
    one that is never auto-approved as a file read or edit."""
    read_only: ClassVar[bool] = False
    """True for a tool no call of which changes anything (Read, Grep, Think): each call is then
    read-only and, by default, concurrency-safe. A tool whose answer depends on the input
    (Bash) overrides `is_read_only` instead."""

    def is_read_only(self, input: InputT) -> bool:
        return self.read_only

    def is_concurrency_safe(self, input: InputT) -> bool:
        return self.is_read_only(input)

    def write_scope(self, input: InputT, workspace: Path) -> tuple[Path, ...] | None:
        """The directories this call may change, when it is confined to them (a scoped
        writer: orchestrator/calls/scopes.py), absolute and normalised, from the input alone (no
        file system: it runs while the message streams); None (the default): not confined."""
        return None

    def timeout_s(self, input: InputT) -> float | None:
        """Wall-time limit of this call, enforced by the pipeline; None (the default): the
        session's limit (`limits.tool_timeout_s`, `DEFAULT_TOOL_TIMEOUT_S`)."""
        return None

    async def validate(self, input: InputT, ctx: ToolContext) -> str | None:
        """Business checks before permission is asked. A string refuses the call (for the model)."""
        return None

    def call(self, input: InputT, ctx: ToolContext) -> AsyncIterator[ToolProgress | ToolOutput]:
        raise NotImplementedError

    def render_use(self, input: InputT) -> str:
        """One line for humans describing the call, e.g. `Read(/repo/a.py)`."""
        args = ", ".join(f"{k}={v!r}" for k, v in input.model_dump(exclude_defaults=True).items())
        return f"{self.name}({args})"

    def render_result(self, output: ToolOutput) -> str:
        """A short view of the result for humans."""
        if output.summary:
            return output.summary
        first = output.as_text().strip().splitlines()
        return first[0][:200] if first else "(no output)"

    def input_schema(self) -> dict[str, Any]:
        return copy.deepcopy(input_schema_of(self.input_model))

    def parse_input(self, raw: dict[str, Any]) -> InputT:
        """Schema validation; raises pydantic's ValidationError."""
        parsed: InputT = self.input_model.model_validate(raw)  # type: ignore[assignment]
        return parsed


class BlockingTool(Tool[InputT]):
    """A tool whose call is one piece of blocking file work with no progress to report (Read,
    Write, Edit, LS): `run` makes the output in a worker thread, so the trio loop never waits
    on the disk."""

    def run(self, input: InputT, ctx: ToolContext) -> ToolOutput:
        """The call's work, blocking (in a worker thread); raises `ToolError` for the model."""
        raise NotImplementedError

    async def call(
        self, input: InputT, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        yield await trio.to_thread.run_sync(self.run, input, ctx)


@functools.cache
def input_schema_of(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema of an input model, made once per class: pydantic builds it anew on
    every call (about 5 ms a tool), and the first request of every session needs them all.
    A pure function of the class, so the warm server computes them before it forks
    (`orchestrator.cli.warm.server`); callers get a copy each."""
    schema = model.model_json_schema(by_alias=True)
    schema.pop("title", None)
    return schema
