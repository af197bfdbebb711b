"""The policy decision for one tool call: allow, deny or ask, with the rule and file behind it.

The coordinator's permission glue (in `orchestrator`) hands each call's tool name, input and
declared `ToolFacts` to `PolicyEngine.assess` (once per call, while the call is planned) and
`PolicyEngine.decide`, and turns the `PolicyDecision` into the kernel's Allow/Deny/Ask. This
module works on plain values (a tool name, a mapping, the facts) so `policies` never imports
the orchestrator (DESIGN.md, "Packages"), and it keeps no table of tool names: families and
path fields are the tools' own facts.

Order, first that applies wins:

1. deny rules, from any level (an untrusted project's too); a Bash command matches a command
   rule through wrappers, git's global options, program paths and `sh -c`/`eval` scripts
   (`policies.command_views`), and a `Read(...)` rule when it names the file;
2. plan mode: a call that is not read-only is denied, with a message saying plan mode;
3. built-in checks: an edit of a protected path (`.git/hooks`, `.warren/`, ...) or a file
   call on a masked secret is denied; a Bash critical delete (`policies.critical`) asks,
   so no allow rule and no mode approves it;
4. ask rules (except in bypass mode);
5. allow rules of trusted levels, and rules remembered in this session. For Bash, every
   simple command of the line must be allowed by a rule, or be read-only under a proven
   floor, and nothing else in the line may write (`make check && ls` yes, `make check;
   curl x` no);
6. the mode: `bypass` allows everything left, `accept-edits` allows edits inside the
   workspace and the writable roots;
7. built-in read-only approval: a Bash command the analyser auto-approves (with the floor:
   any read-only command, run with the workspace read-only; without it: a short exact list),
   and any call the tool itself calls read-only;
8. everything else asks. In `dont-ask` mode every ask becomes a deny.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from policies.bash_analysis import BashAnalyser, BashClassification, CommandPart
from policies.claude_names import WORKFLOW_TOOL
from policies.facts import ToolFacts
from policies.files import EffectivePolicy, Mode, PolicyError, RuleEntry
from policies.mode import PermissionMode
from policies.rules import (
    CompiledRule,
    ParsedRule,
    PathPattern,
    bash_rule_matches,
    compile_path_pattern,
    compile_rule,
    parse_rule,
)
from sandbox.spec import DEFAULT_DENY_READ, DEFAULT_PROTECTED

__all__ = [
    "BypassRefused",
    "CallAssessment",
    "Decision",
    "FloorState",
    "PolicyDecision",
    "PolicyEngine",
    "audit_fields",
    "input_digest",
]

Decision = Literal["allow", "deny", "ask"]
FloorState = Literal["proven", "unproven"]

_BASH_FACTS: Final = ToolFacts(family="exec", command_field="command")
"""A call named by the `Bash` rule keyword whose caller gave no facts: the rule syntax itself
says `Bash(...)` matches the command line in `command`."""
_UNKNOWN_FACTS: Final = ToolFacts(family="external")
"""Any other call without facts: no family, no path; it asks unless a rule names it."""


def default_facts(tool: str) -> ToolFacts:
    """The facts assumed for a call of a tool nobody declared facts for."""
    return _BASH_FACTS if tool == "Bash" else _UNKNOWN_FACTS


@dataclass(frozen=True, slots=True)
class PolicyDecision:
    """What the policy says about one call, and why."""

    decision: Decision
    reason: str
    """Deny: the message for the model (why, and what to do instead). Ask: the question's
    reason for the user. Allow: why, for the audit log."""
    rule: str | None
    """The rule that decided (`Bash(npm run test:*)`), or a built-in label (`read-only`,
    `protected path`, `plan mode`, ...); None when nothing matched and the call asks."""
    source: str
    """The file that decided, or `built-in`, `command line`, `mode`, `session`."""
    read_only: bool
    """The call cannot change anything (Bash: the analyser's verdict; others: the tool's)."""
    concurrency_safe: bool
    """May run in parallel with other safe calls."""
    mode: Mode
    floor: FloorState
    run_read_only: bool = False
    """Must run with the workspace mounted read-only: a Bash command auto-approved because
    the analyser classified it read-only under a proven floor. The kernel enforces it."""


class BypassRefused(PolicyError):
    """`bypass` mode without a proven floor and without the explicit consent flag."""


@dataclass(frozen=True, slots=True)
class _Rule:
    compiled: CompiledRule
    entry_source: str

    @property
    def text(self) -> str:
        return self.compiled.text


@dataclass(frozen=True, slots=True)
class _Call:
    tool: str
    input: Mapping[str, Any]
    read_only: bool
    facts: ToolFacts = _UNKNOWN_FACTS
    any_paths: tuple[str, ...] = ()
    """The path as written (normalised) and its resolved target: deny and ask match either."""
    resolved: str | None = None
    """The resolved path alone: allow rules and the workspace checks use only this."""
    bash: BashClassification | None = None
    command: str | None = None


CallAssessment = _Call
"""What the engine worked out about one call before deciding it (the Bash analyser's
classification, the resolved paths): made once by `PolicyEngine.assess`, handed back to
`decide`, so a call is never classified twice."""


def input_digest(input: Mapping[str, Any]) -> str:
    """The audit log's digest of a tool input (same scheme as `orchestrator.records.audit`)."""
    text = json.dumps(dict(input), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def audit_fields(decision: PolicyDecision, tool: str, input: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of the audit record of one decision."""
    return {
        "tool": tool,
        "input_digest": input_digest(input),
        "decision": decision.decision,
        "rule": decision.rule,
        "source": decision.source,
        "mode": decision.mode,
        "floor": decision.floor,
        "run_read_only": decision.run_read_only,
    }


class PolicyEngine:
    """Decides tool calls for one session under one effective policy and floor.

    Holds the compiled rules, the bash analyser (its parser is kept between calls) and the
    rules remembered during the session. Construct one per session; `decide` is cheap
    (well under a millisecond for a typical call, tests/bench/bench_policy.py).

    Errors: `BypassRefused` when the mode is `bypass`, the floor is not proven and
    `no_sandbox_consent` (`--i-know-there-is-no-sandbox`) was not given.
    """

    def __init__(
        self,
        policy: EffectivePolicy,
        *,
        workspace: Path,
        floor_proven: bool,
        analyser: BashAnalyser | None = None,
        no_sandbox_consent: bool = False,
        home: Path | None = None,
        env: Mapping[str, str] | None = None,
        tool_facts: Mapping[str, ToolFacts] | None = None,
    ) -> None:
        """`tool_facts`: the facts the session's tools declare, by name, for calls decided
        without facts (`remember`, `warren policy check`); a call's own facts win."""
        env = os.environ if env is None else env
        self._tool_facts: Mapping[str, ToolFacts] = tool_facts or {}
        if policy.mode == "bypass" and not floor_proven and not no_sandbox_consent:
            raise BypassRefused(
                "bypass mode runs every call without asking, which needs the sandbox floor, "
                "and the floor is not proven on this machine (see `warren doctor`); choose "
                "another mode, or pass --i-know-there-is-no-sandbox to accept the risk",
                file=policy.mode_source,
                key="mode",
            )
        self.policy = policy
        self.permission_mode = PermissionMode(policy.mode, floor_proven=floor_proven)
        """The mode in force, live (policies/mode.py): its `set` is the one way to change it."""
        self.floor_proven = floor_proven
        self.floor: FloorState = "proven" if floor_proven else "unproven"
        self.workspace = workspace.resolve()
        self.analyser = analyser or BashAnalyser()
        self._home = (home or Path(env.get("HOME") or Path.home())).resolve()
        self._check_path_rules(policy.rules)
        self._deny = self._compile(policy.rules, "deny")
        self._ask = self._compile(policy.rules, "ask")
        self._allow = self._compile(policy.rules, "allow")
        self._session: list[_Rule] = []
        self._roots = tuple(
            _norm(str(root)) for root in (self.workspace, *(r for r, _ in policy.writable_roots))
        )
        self._protected = self._protected_paths()
        self._masked = self._masked_patterns(env)

    @property
    def mode(self) -> Mode:
        """The mode in force now (`permission_mode.current`)."""
        return self.permission_mode.current

    # -- set-up --

    def _compile(self, entries: tuple[RuleEntry, ...], kind: str) -> tuple[_Rule, ...]:
        return tuple(
            _Rule(
                compile_rule(
                    entry.parsed, anchor=entry.anchor, workspace=self.workspace, home=self._home
                ),
                entry.source,
            )
            for entry in entries
            if entry.kind == kind and entry.active
        )

    def _check_path_rules(self, entries: tuple[RuleEntry, ...]) -> None:
        """A path rule naming a declared tool that takes no path would match nothing: refuse
        it with its file, rather than let the user believe it holds."""
        for entry in entries:
            parsed = entry.parsed
            facts = self._tool_facts.get(parsed.tool)
            if parsed.kind == "path" and facts is not None and not facts.path_fields:
                raise PolicyError(
                    f"`{parsed.text}`: {parsed.tool} takes no path, so this rule would match "
                    f"nothing; write `{parsed.tool}` to match every call of it",
                    file=entry.source,
                    key=entry.kind,
                )

    def _protected_paths(self) -> tuple[tuple[str, str], ...]:
        """(absolute path, as configured) for every protected path in every writable root."""
        configured = [p.path for p in DEFAULT_PROTECTED]
        configured += [pattern for pattern, _ in self.policy.protected]
        out: list[tuple[str, str]] = []
        for name in configured:
            if name.startswith("/"):
                out.append((_norm(name), name))
            else:
                out.extend((_norm(f"{root}/{name}"), name) for root in self._roots)
        return tuple(out)

    def _masked_patterns(self, env: Mapping[str, str]) -> tuple[tuple[PathPattern, str], ...]:
        config = {env.get("XDG_CONFIG_HOME") or "", str(self._home / ".config")} - {""}
        state = {env.get("XDG_STATE_HOME") or "", str(self._home / ".local" / "state")} - {""}
        out: list[tuple[PathPattern, str]] = []
        patterns = [*DEFAULT_DENY_READ, *(pattern for pattern, _ in self.policy.deny_read)]
        for pattern in patterns:
            expansions = [pattern]
            if pattern == "~" or pattern.startswith("~/"):
                expansions = [str(self._home) + pattern[1:]]
            for token, values in (("{config}", config), ("{state}", state)):
                expansions = (
                    [e.replace(token, v) for e in expansions for v in values]
                    if any(token in e for e in expansions)
                    else expansions
                )
            for expanded in expansions:
                if not expanded.startswith("/"):
                    continue
                compiled = compile_path_pattern(
                    "//" + _norm(expanded).lstrip("/"),
                    anchor=self.workspace,
                    workspace=self.workspace,
                    home=self._home,
                )
                out.append((compiled, pattern))
        return tuple(out)

    # -- the decision --

    def assess(
        self,
        tool: str,
        input: Mapping[str, Any],
        *,
        tool_read_only: bool,
        facts: ToolFacts | None = None,
    ) -> CallAssessment:
        """Everything about one call that does not depend on the rules: the Bash analyser's
        classification (a tool with a `command_field`: its read-only verdict is the
        analyser's, `tool_read_only` is ignored) and the resolved paths. Never raises."""
        return self._call(tool, input, tool_read_only, facts or self.facts_of(tool))

    def facts_of(self, tool: str) -> ToolFacts:
        """The facts declared for `tool` (the constructor's `tool_facts`), else the defaults."""
        return self._tool_facts.get(tool) or default_facts(tool)

    def decide(
        self,
        tool: str,
        input: Mapping[str, Any],
        *,
        tool_read_only: bool,
        facts: ToolFacts | None = None,
        assessed: CallAssessment | None = None,
    ) -> PolicyDecision:
        """Decide one call. Never raises for any input mapping.

        `facts`: what the tool declares (family, path fields); without them a `Bash` call is
        a shell command and any other tool has no family and no path. `assessed`: this
        call's `assess` result, so it is not classified again.
        """
        call = assessed or self._call(tool, input, tool_read_only, facts or self.facts_of(tool))
        hit = self._first_match(self._deny, call)
        if hit is not None:
            return self._result(
                call,
                "deny",
                f"Permission to use {tool} was denied by the rule `{hit.text}` in "
                f"{hit.entry_source}. Do not retry this call; find another way or ask the user.",
                hit.text,
                hit.entry_source,
            )
        named = self._bash_names_path(self._deny, call)
        if named is not None:
            hit, path = named
            return self._result(
                call,
                "deny",
                f"The command names {path}, which the rule `{hit.text}` in {hit.entry_source} "
                "denies reading. Do not retry this call; find another way or ask the user.",
                hit.text,
                hit.entry_source,
            )
        if self.mode == "plan" and not call.read_only:
            return self._result(
                call,
                "deny",
                f"Plan mode: only read-only tools run, and this {tool} call could change "
                f"something{_danger_note(call)}. Finish the plan and present it to the user; "
                "they leave plan mode to carry it out.",
                "plan mode",
                "mode",
            )
        builtin = self._builtin_check(call)
        if builtin is not None:
            return builtin
        if self.mode != "bypass":
            named = self._bash_names_path(self._ask, call)
            if named is not None:
                return self._ask_result(
                    call,
                    f"the command names {named[1]}, and the rule `{named[0].text}` in "
                    f"{named[0].entry_source} asks before reading it",
                    named[0].text,
                    named[0].entry_source,
                )
            hit = self._first_match(self._ask, call)
            if hit is not None:
                return self._ask_result(
                    call,
                    f"the rule `{hit.text}` in {hit.entry_source} asks",
                    hit.text,
                    hit.entry_source,
                )
        hit = self._allowed(call)
        if hit is not None:
            return self._result(
                call, "allow", f"allowed by `{hit.text}`", hit.text, hit.entry_source
            )
        if self.mode == "bypass":
            return self._result(call, "allow", "bypass mode", "bypass mode", "mode")
        if (
            self.mode == "accept-edits"
            and call.facts.family == "edit"
            and call.resolved is not None
            and self._in_roots(call.resolved)
        ):
            return self._result(
                call,
                "allow",
                "accept-edits mode: an edit inside the workspace",
                "accept-edits mode",
                "mode",
            )
        if call.bash is not None:
            if call.bash.decision_hint == "allow":
                return self._result(call, "allow", call.bash.hint_reason, "read-only", "built-in")
            return self._ask_result(call, _bash_reason(call.bash), None, "built-in")
        if tool_read_only:
            return self._result(call, "allow", "a read-only call", "read-only", "built-in")
        return self._ask_result(call, _default_reason(call), None, "built-in")

    def _builtin_check(self, call: _Call) -> PolicyDecision | None:
        if call.facts.family == "edit":
            for candidate in call.any_paths:
                for path, name in self._protected:
                    if candidate == path or candidate.startswith(path + "/"):
                        return self._result(
                            call,
                            "deny",
                            f"{candidate} is a protected path ({name}): the sandbox keeps it "
                            "read-only because it can run code outside the sandbox. Do not "
                            "retry; tell the user what to change there.",
                            "protected path",
                            "built-in",
                        )
        if call.facts.path_fields:
            for candidate in call.any_paths:
                for pattern, name in self._masked:
                    if pattern.matches(candidate):
                        return self._result(
                            call,
                            "deny",
                            f"{candidate} holds secrets ({name}), which the sandbox masks from "
                            "every tool. Do not retry; ask the user for what you need.",
                            "masked secret",
                            "built-in",
                        )
        if call.bash is not None and call.bash.critical_delete:
            # Before allow rules and the mode: no rule (`Bash(rm:*)` included) and no mode
            # (bypass included) auto-approves a critical delete (tests/policies/
            # test_critical_deletes.py). Where nobody can answer, the ask is a deny.
            what = call.bash.critical_reason or "the command deletes a critical path"
            return self._ask_result(
                call,
                f"{what}; a critical delete (the workspace, its .git, an ancestor, ~ or /, or "
                "a recursive delete of anything but a literal path inside the workspace) is "
                "never run without asking",
                "critical delete",
                "built-in",
            )
        return None

    # -- matching --

    def _call(
        self, tool: str, input: Mapping[str, Any], tool_read_only: bool, facts: ToolFacts
    ) -> _Call:
        if facts.command_field is not None:
            command = input.get(facts.command_field)
            if not isinstance(command, str):
                command = ""
            classification = self.analyser.classify(
                command, floor=self.floor_proven, workspace=self.workspace
            )
            return _Call(
                tool,
                input,
                classification.read_only,
                facts,
                bash=classification,
                command=command,
            )
        if facts.path_fields:
            raw = _path_input(input, facts)
            if raw is None and facts.path_defaults_to_workspace:
                raw = str(self.workspace)
            if isinstance(raw, str) and raw and "\x00" not in raw:
                path = raw if raw.startswith("/") else f"{self.workspace}/{raw}"
                lexical = _norm(path)
                resolved = _norm(os.path.realpath(path))
                paths = (lexical,) if lexical == resolved else (lexical, resolved)
                return _Call(tool, input, tool_read_only, facts, any_paths=paths, resolved=resolved)
        return _Call(tool, input, tool_read_only, facts)

    def compile_matcher(self, parsed: ParsedRule, *, anchor: Path) -> CompiledRule:
        """A rule used as a hook matcher (orchestrator/hooks), bound like a policy rule."""
        return compile_rule(parsed, anchor=anchor, workspace=self.workspace, home=self._home)

    def rule_matches(self, rule: CompiledRule, assessed: CallAssessment) -> bool:
        """Does `rule` match an assessed call, the way a deny rule would (either path, any
        part of a compound command, git's global options seen through)? For hook matchers:
        a hook on `Bash(git push:*)` sees `git -C . push` as its deny rule would."""
        return self._matches(rule, assessed, strict=False)

    def _first_match(self, rules: tuple[_Rule, ...], call: _Call) -> _Rule | None:
        for rule in rules:
            if self._matches(rule.compiled, call, strict=False):
                return rule
        return None

    def _matches(self, rule: CompiledRule, call: _Call, *, strict: bool) -> bool:
        """Does `rule` match `call`? `strict` (allow rules): resolved paths only."""
        if not rule.covers(call.tool, call.facts.family):
            return False
        parsed = rule.parsed
        match parsed.kind:
            case "tool" | "mcp_server":
                return True
            case "path":
                if strict:
                    return call.resolved is not None and rule.matches_path((call.resolved,))
                return rule.matches_path(call.any_paths)
            case "agent":
                name = call.input.get("subagent_type") or "general"
                return name == parsed.specifier
            case "workflow":  # a saved workflow by name, never a script the model wrote
                inline = any(call.input.get(k) for k in ("script", "scriptPath", "resumeFromRunId"))
                return not inline and call.input.get("name") == parsed.specifier
            case "exact" | "prefix" | "wildcard":
                assert parsed.specifier is not None and call.command is not None
                if bash_rule_matches(parsed.kind, parsed.specifier, call.command):
                    return True
                assert call.bash is not None
                return any(
                    _part_matches(parsed.kind, parsed.specifier, part) for part in call.bash.parts
                ) or any(
                    _view_matches(parsed.kind, parsed.specifier, view) for view in call.bash.views
                )
        return False

    def _bash_names_path(self, rules: tuple[_Rule, ...], call: _Call) -> tuple[_Rule, str] | None:
        """A `Read(...)` rule matching a file a Bash command names (`cat .env`,
        `git show HEAD:.env`, `head ./.env`, `cat < .env`), with that path.

        Only explicit words are seen: what a command finds by itself (`grep -r`, `find`) is
        kept from it by the sandbox's read masks, not here.
        """
        if call.bash is None:
            return None
        read_rules = [
            rule
            for rule in rules
            if rule.compiled.parsed.kind == "path" and rule.compiled.covers("Read", "read")
        ]
        if not read_rules:
            return None
        for view in call.bash.views:
            for word in view[1:]:
                for candidate in _named_paths(word):
                    path = (
                        candidate if candidate.startswith("/") else f"{self.workspace}/{candidate}"
                    )
                    lexical = _norm(path)
                    resolved = _norm(os.path.realpath(path))
                    paths = (lexical,) if lexical == resolved else (lexical, resolved)
                    for rule in read_rules:
                        if rule.compiled.matches_path(paths):
                            return rule, lexical
        return None

    def _allowed(self, call: _Call) -> _Rule | None:
        rules = (*self._allow, *self._session)
        if call.bash is None:
            for rule in rules:
                if self._matches(rule.compiled, call, strict=True):
                    return rule
            return None
        return self._bash_allowed(rules, call)

    def _bash_allowed(self, rules: tuple[_Rule, ...], call: _Call) -> _Rule | None:
        classification = call.bash
        assert classification is not None and call.command is not None
        text = call.command.strip()
        for rule in rules:
            parsed = rule.compiled.parsed
            if parsed.tool != "Bash":
                continue
            if parsed.kind == "tool" or (parsed.kind == "exact" and parsed.specifier == text):
                return rule
        if not classification.parse_ok or classification.too_long or not classification.parts:
            return None
        first: _Rule | None = None
        excused: set[str] = set()
        for part in classification.parts:
            hit = next(
                (
                    rule
                    for rule in rules
                    if rule.compiled.parsed.kind in ("exact", "prefix", "wildcard")
                    and _part_allowed(rule.compiled, part)
                ),
                None,
            )
            if hit is not None:
                first = first or hit
                if part.reason is not None:
                    excused.add(part.reason)
            elif not (part.read_only and self.floor_proven):
                return None
        if first is None:
            return None
        if any(reason not in excused for reason in classification.reasons):
            return None  # something outside the allowed commands writes (a redirection, ...)
        return first

    def _in_roots(self, path: str) -> bool:
        return any(path == root or path.startswith(root + "/") for root in self._roots)

    # -- results --

    def _result(
        self, call: _Call, decision: Decision, reason: str, rule: str | None, source: str
    ) -> PolicyDecision:
        auto_read_only = (
            decision == "allow" and call.bash is not None and call.bash.decision_hint == "allow"
        )
        if call.bash is not None:
            concurrency_safe = auto_read_only
        else:
            concurrency_safe = decision == "allow" and call.read_only
        return PolicyDecision(
            decision=decision,
            reason=reason,
            rule=rule,
            source=source,
            read_only=call.read_only,
            concurrency_safe=concurrency_safe,
            mode=self.mode,
            floor=self.floor,
            run_read_only=auto_read_only and self.floor_proven,
        )

    def _ask_result(
        self, call: _Call, reason: str, rule: str | None, source: str
    ) -> PolicyDecision:
        if self.mode == "dont-ask":
            return self._result(
                call,
                "deny",
                f"Not run: in dont-ask mode a call that needs permission is denied ({reason}). "
                "Do not retry it; continue without it or tell the user what you need.",
                rule or "dont-ask mode",
                source if rule else "mode",
            )
        return self._result(call, "ask", reason, rule, source)

    # -- "don't ask again" --

    def remember(
        self, tool: str, input: Mapping[str, Any], *, facts: ToolFacts | None = None
    ) -> str:
        """The rule to store for a "don't ask again" answer, also allowed for this session.

        Bash: the analyser's suggestion (a prefix rule for a plain command, else the exact
        line). Path tools: that one file (`Edit(/src/a.py)`, anchored to the workspace, or
        `//abs/path` outside it). dispatch_agent: that agent type. Others: the tool name.
        Persist it with `policies.files.save_remembered_rule`.

        Errors: `PolicyError` when no rule covers just this call (a path that cannot be
        written as a rule); then allow the call once and do not store anything.
        """
        rule = self.suggest_rule(tool, input, facts=facts)
        self.allow_for_session(rule)
        return rule

    def suggest_rule(
        self, tool: str, input: Mapping[str, Any], *, facts: ToolFacts | None = None
    ) -> str:
        """The rule `remember` would store for this call, allowing nothing yet (a dialog shows
        it before the user agrees). **Errors:** `PolicyError`, as `remember`."""
        return _suggest_rule(
            tool, input, facts or self.facts_of(tool), self.workspace, self.analyser
        )

    def allow_for_session(self, rule: str) -> None:
        """Allow calls matching `rule` until the engine is dropped (source `session`)."""
        compiled = compile_rule(
            parse_rule(rule), anchor=self.workspace, workspace=self.workspace, home=self._home
        )
        self._session.append(_Rule(compiled, "session"))


def _path_input(input: Mapping[str, Any], facts: ToolFacts) -> object:
    """The first of the tool's declared path fields present in the input."""
    for name in facts.path_fields:
        value = input.get(name)
        if value is not None:
            return value
    return None


def _suggest_rule(
    tool: str, input: Mapping[str, Any], facts: ToolFacts, workspace: Path, analyser: BashAnalyser
) -> str:
    if facts.command_field is not None:
        command = input.get(facts.command_field)
        return analyser.suggest_rule(command) if isinstance(command, str) else tool
    if facts.path_fields:
        raw = _path_input(input, facts)
        if not isinstance(raw, str) or not raw or "\x00" in raw:
            raise PolicyError(f"cannot remember a {tool} call without a usable path", key=tool)
        resolved = _norm(os.path.realpath(raw if raw.startswith("/") else f"{workspace}/{raw}"))
        root = str(workspace)
        inside = resolved.startswith(root + "/")
        spec = "/" + _escape_glob(resolved[len(root) + 1 :] if inside else resolved)
        candidate = f"{tool}({spec})"
    elif tool == WORKFLOW_TOOL:
        name = input.get("name")
        inline = any(input.get(k) for k in ("script", "scriptPath", "resumeFromRunId"))
        candidate = f"{tool}({name})" if isinstance(name, str) and name and not inline else tool
    elif facts.family == "agent":
        name = input.get("subagent_type") or "general"
        candidate = f"{tool}({name})"
    else:
        candidate = tool
    try:
        return parse_rule(candidate).text
    except ValueError as exc:
        # A rule for something else would allow more than the user agreed to.
        raise PolicyError(f"cannot remember this call as a rule: {exc}", key=tool) from None


def _escape_glob(path: str) -> str:
    return "".join("\\" + c if c in "*?[" else c for c in path)


def _norm(path: str) -> str:
    """A normalised absolute path string (`//x` is `/x`, no trailing slash)."""
    text = os.path.normpath(path)
    return "/" + text.lstrip("/") if text.startswith("//") else text


def _part_texts(part: CommandPart) -> list[str]:
    texts = [part.text]
    if part.assignments:
        texts.append(" ".join(part.words))
    if part.values and None not in part.values:
        texts.append(" ".join(v for v in part.values if v is not None))
    return texts


_WRAPPERS: Final = frozenset(
    {"env", "timeout", "nice", "nohup", "stdbuf", "time", "command", "builtin", "exec"}
    | {"sudo", "doas", "xargs"}
)


def _part_matches(
    kind: Literal["exact", "prefix", "wildcard"], specifier: str, part: CommandPart
) -> bool:
    """Deny and ask: any spelling of the simple command, or its program, matches.

    When the analyser could not see through a wrapper (`env A=1 curl x` keeps `env` as the
    program), every tail of the words is tried too: a deny may over-match there, never miss.
    """
    if any(bash_rule_matches(kind, specifier, text) for text in _part_texts(part)):
        return True
    if kind == "prefix" and part.program is not None and specifier == part.program:
        return True
    if part.program in _WRAPPERS or (part.values and part.values[0] in _WRAPPERS):
        words = [v if v is not None else w for v, w in zip(part.values, part.words, strict=False)]
        return any(
            bash_rule_matches(kind, specifier, " ".join(words[start:]))
            for start in range(1, len(words))
        )
    return False


def _named_paths(word: str | None) -> tuple[str, ...]:
    """The paths one argument may name: itself, the value of `--opt=PATH`, the path of
    git's `REV:PATH`."""
    if not word or "\x00" in word:
        return ()
    if word.startswith("-"):
        return (word.split("=", 1)[1],) if "=" in word and not word.endswith("=") else ()
    if ":" in word and not word.startswith("/"):
        rest = word.split(":", 1)[1]
        return (word, rest) if rest else (word,)
    return (word,)


def _view_matches(
    kind: Literal["exact", "prefix", "wildcard"], specifier: str, view: tuple[str | None, ...]
) -> bool:
    """Deny and ask: could the command `view` (`policies.command_views`) be the rule's?

    A word not known before the command runs (`None`) may be anything, so the rule matches
    when the known words before it agree with it: `git $SUB` could be `git clean`, `$CMD x`
    and a script that is not literal could be any command.
    """
    known: list[str] = []
    for word in view:
        if word is None:
            text = " ".join(known)
            if kind == "wildcard":  # the known words agree with the rule's text up to a `*`
                literal = specifier.split("*", 1)[0].replace("\\", "")
                return not known or (text + " ").startswith(literal) or literal.startswith(text)
            return (
                not known
                or bash_rule_matches(kind, specifier, text)
                or specifier.startswith(text + " ")
            )
        known.append(word)
    return bash_rule_matches(kind, specifier, " ".join(known))


def _part_allowed(rule: CompiledRule, part: CommandPart) -> bool:
    """Allow: the simple command exactly as written, assignments included."""
    parsed = rule.parsed
    if parsed.tool != "Bash" or parsed.specifier is None or not part.words:
        return False
    return bash_rule_matches(parsed.kind, parsed.specifier, part.text)


def _danger_note(call: _Call) -> str:
    if call.bash is None or not call.bash.critical_delete:
        return ""
    return f" ({call.bash.critical_reason or 'a critical delete'})"


def _bash_reason(classification: BashClassification) -> str:
    return classification.hint_reason


def _default_reason(call: _Call) -> str:
    if call.facts.family == "edit" and call.resolved is not None:
        return f"{call.tool} would change {call.resolved}"
    return f"{call.tool} can change files or run commands"
