"""`StructuredOutput`: a subagent's final answer as a value checked against a JSON schema.

Warren's own callers (the workflow engine's `agent(prompt, schema=...)`) dispatch an agent
with `DispatchAgentInput.output_schema`, a field the model never sees. For that dispatch the
coordinator serves its agent one more tool, `StructuredOutput`, whose input schema is the given
schema, as Claude Code's `--json-schema` does: the agent is told to finish by calling it exactly
once with its final answer. Each call's input is validated here with `jsonschema` (the draft
the schema declares in `$schema`, else 2020-12); an invalid one gets an error tool_result naming
what failed (where in the object and why: at most `MAX_PROBLEMS_SHOWN` problems, each cut to
`MAX_PROBLEM_CHARS`), so the agent fixes it in the same run. The first valid value is kept;
later calls change nothing. `dispatch_agent` continues an agent that ended without a valid
value once, then fails the dispatch with the reason (orchestrator/agents/dispatch_agent.py).

The schema is checked before anything runs (`output_validator`): its top level must be an
object schema (`"type": "object"`, as every tool's input schema is), it must be JSON, and valid
for its draft; else the dispatch is refused (`ConfigError`, source `output_schema`), with no
worker started and no model request made.

How it is served: through the `SubagentMcp` seam that serves a subagent's MCP tools
(`ServedTools` composes it with them), so the worker needs no new message. Its spec goes down
in `RunAgent.mcp_tools`; the worker offers it like any tool the coordinator serves
(`workers.agent_mcp.ForwardedMcpTool`, which takes the spec's name as it is and assumes no
`mcp__` prefix); each call comes back as an `McpCall`, which `ServedTools` routes by name, to
`StructuredOutput` or to the MCP tools (whose own checks want the `mcp__` prefix). The pool
admits the name because the run offered it (`WorkerPool._admit`). The local pool's workers and
the Ray pool's speak the same protocol to the same `WorkerPool`, so both work alike.

Permission, hooks, audit. A StructuredOutput call touches nothing (the value stays in the
coordinator), so the coordinator's decider allows it without the policy, without an ask and
without a PreToolUse hook's allow or ask (`STRUCTURED_OUTPUT_RULE`). A call is served without a
grant, and a worker that did not run its PreToolUse hooks for it is not refused, as it is for
other tools: a worker that skips either gains nothing, since it already says what it likes in
its final text, and the value is checked against the schema all the same. The worker still
asks for that answer as for any call, so each call appears as a `PermissionDecided` (allow,
that rule) among the subagent's events, and so in the session's audit log. The session's
PreToolUse and PostToolUse hooks fire for it in the worker as for any subagent tool (matched by
the name `StructuredOutput`, or `*`): a PreToolUse deny stops the call there, and an
`updatedInput` is the value validated here. SubagentStop fires at each run's end as usual.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import trio

from orchestrator.agents.dispatch_outcome import MISSING, Missing
from orchestrator.errors import ConfigError
from orchestrator.model.base import ToolSpec
from orchestrator.tools.base import ToolOutput

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

    from orchestrator.agents.types import SubagentMcp

__all__ = [
    "MAX_PROBLEMS_SHOWN",
    "MAX_PROBLEM_CHARS",
    "STRUCTURED_OUTPUT",
    "STRUCTURED_OUTPUT_RULE",
    "ServedTools",
    "StructuredOutput",
    "output_validator",
]

STRUCTURED_OUTPUT: Final = "StructuredOutput"
"""The tool's name, as Claude Code's."""
STRUCTURED_OUTPUT_RULE: Final = "StructuredOutput: touches nothing"
"""The rule of the coordinator's allow, in the audit log."""

MAX_PROBLEMS_SHOWN = 5
"""Schema problems listed in an error tool_result (the first ones by place; more are counted)."""
MAX_PROBLEM_CHARS = 300
"""Characters of one problem's message (jsonschema quotes the offending value in it)."""
_PROBLEMS_COLLECTED = 100
"""Problems gathered before sorting: an array of a million bad items is not walked whole."""

DESCRIPTION = """\
Returns your final answer to the agent that dispatched you, as a JSON object matching this \
tool's input schema: the input is the answer itself. Call it exactly once, at the end, when \
your work is done. If it reports that the object does not match the schema, fix the object and \
call it again. Once a call succeeds, stop: end your turn without calling any more tools."""

SYSTEM_NOTE = (
    f"Your final answer is structured: when you have finished, call the {STRUCTURED_OUTPUT} "
    "tool exactly once with it, as a JSON object matching that tool's input schema. Your task "
    "is not done until that call succeeds; if it reports an error, fix the object and call it "
    "again. After it succeeds, end your turn with one short sentence and no more tool calls."
)
"""The last-but-context system block of a dispatch with `output_schema`."""


def output_validator(schema: object) -> Validator:
    """A validator for structured outputs of `schema`, once `schema` itself is checked: a JSON
    object whose top level describes an object (`"type": "object"`), valid for the draft its
    `$schema` names (2020-12 when it names none).

    **Errors:** `ConfigError` (source `output_schema`) saying what is wrong and how to fix it.
    """
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import Draft202012Validator, validator_for

    if not isinstance(schema, dict):
        raise ConfigError(
            f"must be a JSON schema (a JSON object), not {type(schema).__name__}",
            source="output_schema",
        )
    try:
        json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"is not JSON: {exc}", source="output_schema") from None
    if schema.get("type") != "object":
        raise ConfigError(
            'must describe an object at its top level ("type": "object"), as a tool\'s '
            "input schema does: put any other value in a property, e.g. "
            '{"type": "object", "properties": {"answer": {...}}, "required": ["answer"]}',
            source="output_schema",
        )
    declared = schema.get("$schema")
    cls: type[Validator] = Draft202012Validator
    if declared is not None:
        if isinstance(declared, str):  # `validator_for` would fail on an unhashable one
            cls = validator_for(schema, default=Draft202012Validator)
        if not _names_draft(declared, cls):
            raise ConfigError(
                f"$schema {declared!r} is not a JSON Schema draft jsonschema knows; leave "
                "$schema out (draft 2020-12) or name a published draft",
                source="output_schema",
            )
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        where = _where(exc.absolute_path)
        raise ConfigError(
            f"is not a valid schema (at {where}): {_cut(exc.message)}", source="output_schema"
        ) from None
    validator: Validator = cls(schema)
    return validator


def _names_draft(declared: object, cls: type[Validator]) -> bool:
    """Whether `$schema` names the draft of `cls` (`validator_for` falls back to its default
    for a `$schema` it does not know, silently when given one)."""
    ids = {str(cls.META_SCHEMA.get(key, "")).rstrip("#") for key in ("$id", "id")}
    return isinstance(declared, str) and declared.rstrip("#") in ids - {""}


class StructuredOutput:
    """The `StructuredOutput` tool of one dispatch, for all its runs (two when its agent is
    continued): the spec the agent is offered, each call validated, the first valid value."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        """**Errors:** `ConfigError` (source `output_schema`) for an unusable schema
        (`output_validator`)."""
        self._validator = output_validator(schema)
        self.spec = ToolSpec(STRUCTURED_OUTPUT, DESCRIPTION, copy.deepcopy(dict(schema)))
        self.value: dict[str, Any] | Missing = MISSING
        """The first input that matched the schema."""
        self.problem: str | None = None
        """What was wrong with the latest call that did not match."""
        self._run_calls = 0

    @property
    def has_value(self) -> bool:
        return self.value is not MISSING

    def begin_run(self) -> None:
        """A run of the agent starts: `why_missing` speaks of its calls."""
        self._run_calls = 0

    async def call(self, input: dict[str, Any]) -> ToolOutput:
        """One call of the agent's: its input validated (in a thread: a schema's patterns are
        the caller's, and the loop must not wait on them); the value kept if it is the first
        valid one. Never raises for a bad value: the error result says what to fix."""
        self._run_calls += 1
        if self.has_value:
            return ToolOutput(
                "Your structured output was already recorded (the first valid call counts); "
                "this call changed nothing. End your turn now.",
                summary="already recorded",
            )
        problems = await trio.to_thread.run_sync(_problems, self._validator, input)
        if problems is not None:
            self.problem = problems
            return ToolOutput(
                f"The {STRUCTURED_OUTPUT} input does not match its schema:\n{problems}\n"
                f"Fix the object and call {STRUCTURED_OUTPUT} again with the whole of it.",
                is_error=True,
                summary="does not match the schema",
            )
        self.value = copy.deepcopy(input)
        return ToolOutput(
            "Your structured output was recorded. You are done: end your turn now with one "
            "short sentence, without calling any more tools.",
            summary="recorded",
        )

    def why_missing(self) -> str:
        """Why there is no value after the latest run, for the agent and the caller."""
        if self._run_calls == 0:
            earlier = (
                f" (an earlier call did not match the schema:\n{self.problem})"
                if self.problem
                else ""
            )
            return f"it ended without calling {STRUCTURED_OUTPUT}{earlier}"
        return f"its {STRUCTURED_OUTPUT} input did not match the schema:\n{self.problem}"

    def continuation(self) -> str:
        """The message that continues an agent that ended without a valid value."""
        return (
            f"You have not given a valid structured output: {self.why_missing()}\n\n"
            f"Call {STRUCTURED_OUTPUT} now with your final answer, a JSON object matching its "
            "input schema. Do not redo your work: answer from what you already know."
        )


class ServedTools:
    """The tools the coordinator serves one subagent run (`SubagentMcp`): `StructuredOutput`,
    and its MCP tools when its type names some. A call goes to the one its name names."""

    def __init__(self, structured: StructuredOutput, mcp: SubagentMcp | None) -> None:
        self._structured = structured
        self._mcp = mcp

    def specs(self) -> list[ToolSpec]:
        return [*([] if self._mcp is None else self._mcp.specs()), self._structured.spec]

    async def call(self, tool: str, input: dict[str, Any]) -> ToolOutput:
        if tool == STRUCTURED_OUTPUT:
            return await self._structured.call(input)
        if self._mcp is None:
            why = f"{tool} is not one of this agent's tools; it was not run."
            return ToolOutput(why, is_error=True)
        return await self._mcp.call(tool, input)


def _problems(validator: Validator, value: dict[str, Any]) -> str | None:
    """The value's schema problems, first by place, for the model; None: it matches."""
    try:
        found = list(itertools.islice(validator.iter_errors(value), _PROBLEMS_COLLECTED))
    except Exception as exc:  # a $ref that does not resolve, a value nested too deep
        return f"- the schema could not be applied to it: {_cut(f'{type(exc).__name__}: {exc}')}"
    if not found:
        return None
    found.sort(key=lambda e: (len(e.absolute_path), _where(e.absolute_path)))
    lines = [
        f"- at {_where(e.absolute_path)}: {_cut(e.message)}" for e in found[:MAX_PROBLEMS_SHOWN]
    ]
    if len(found) > MAX_PROBLEMS_SHOWN:
        more = len(found) - MAX_PROBLEMS_SHOWN
        lines.append(f"- ... and {more}{'+' if len(found) == _PROBLEMS_COLLECTED else ''} more")
    return "\n".join(lines)


def _where(path: Any) -> str:
    """A place in the value, JSONPath-like: `$`, `$.items[2].name`, `$["a b"]`."""
    parts = ["$"]
    for part in path:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        elif isinstance(part, str) and part.isidentifier():
            parts.append(f".{part}")
        else:
            parts.append(f"[{json.dumps(part, ensure_ascii=False)}]")
    return "".join(parts)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_PROBLEM_CHARS else text[: MAX_PROBLEM_CHARS - 3] + "..."
