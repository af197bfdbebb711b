"""The policy engine: precedence, modes, the floor, symlinks, built-in checks, remembering.

Policies are built from TOML text per level with `merge_policy` (pure), so each test states
exactly which level says what. The hypothesis property at the end is the one that matters
most: adding a deny rule, at any level, never turns a decision into allow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.tools.registry import builtin_facts
from policies.bash_analysis import BashAnalyser
from policies.engine import (
    BypassRefused,
    PolicyDecision,
    PolicyEngine,
    audit_fields,
)
from policies.files import (
    Level,
    PolicyLayer,
    PolicyPaths,
    load_effective_policy,
    merge_policy,
    parse_policy_text,
    save_remembered_rule,
)
from policies.trust import TrustStore

ANALYSER = BashAnalyser()  # one parser for every test; classification is pure
FACTS = builtin_facts()  # what the built-in tools declare (family, path fields)
READ_ONLY_TOOLS = frozenset(n for n, f in FACTS.items() if f.family in ("read", "meta"))


class World:
    """A real workspace and home under tmp_path, and policies given per level as TOML."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.ws = self.root / "ws"
        self.ws.mkdir()
        self.home = self.root / "home"
        self.home.mkdir()
        # Not ~/.config/warren: Warren masks its own configuration from every tool.
        self.user_dir = self.root / "userconf"
        self.env = {"HOME": str(self.home)}

    def engine(
        self,
        *levels: tuple[Level, str],
        floor: bool = True,
        consent: bool = False,
        untrusted: frozenset[Level] = frozenset(),
    ) -> PolicyEngine:
        layers = []
        for level, text in levels:
            anchor = self.user_dir if level == "user" else self.ws
            source = f"{level}.toml" if level not in ("built-in", "command line") else level
            policy = parse_policy_text(text, file=source)
            layers.append(
                PolicyLayer(level, source, policy, anchor, trusted=level not in untrusted)
            )
        merged = merge_policy(self.ws, layers, home=self.home)
        return PolicyEngine(
            merged,
            workspace=self.ws,
            floor_proven=floor,
            analyser=ANALYSER,
            no_sandbox_consent=consent,
            env=self.env,
            tool_facts=FACTS,
        )


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def bash(engine: PolicyEngine, command: str) -> PolicyDecision:
    return engine.decide("Bash", {"command": command}, tool_read_only=False)


def call(engine: PolicyEngine, tool: str, path: Path | str) -> PolicyDecision:
    key = {"NotebookEdit": "notebook_path", "Glob": "path", "Grep": "path", "LS": "path"}
    input = {key.get(tool, "file_path"): str(path)}
    return engine.decide(tool, input, tool_read_only=tool in READ_ONLY_TOOLS)


def rules(kind: str, *texts: str) -> str:
    return f"[permissions]\n{kind} = {json.dumps(list(texts))}\n"


# -- precedence --


def test_deny_anywhere_wins_over_allow_anywhere(world: World) -> None:
    engine = world.engine(
        ("user", rules("deny", "Bash(curl:*)")),
        ("managed", rules("allow", "Bash")),
    )
    decision = bash(engine, "curl https://example.com")
    assert (decision.decision, decision.rule, decision.source) == (
        "deny",
        "Bash(curl:*)",
        "user.toml",
    )
    assert "denied by the rule `Bash(curl:*)` in user.toml" in decision.reason


def test_the_highest_level_deny_is_reported(world: World) -> None:
    engine = world.engine(
        ("user", rules("deny", "Bash(curl:*)")),
        ("project", rules("deny", "Bash")),
        ("managed", rules("deny", "Bash(curl:*)")),
    )
    assert bash(engine, "curl x").source == "managed.toml"


def test_ask_rule_beats_allow_rule(world: World) -> None:
    engine = world.engine(
        ("user", rules("ask", "Bash(git push:*)")),
        ("managed", rules("allow", "Bash(git:*)")),
    )
    decision = bash(engine, "git push origin main")
    assert (decision.decision, decision.rule) == ("ask", "Bash(git push:*)")
    assert bash(engine, "git commit -m x").decision == "allow"


def test_untrusted_allow_is_inactive_but_its_deny_applies(world: World) -> None:
    project = rules("allow", "Edit") + 'deny = ["Bash(curl:*)"]\n'
    engine = world.engine(("project", project), untrusted=frozenset({"project"}))
    assert call(engine, "Edit", world.ws / "a.py").decision == "ask"
    assert bash(engine, "curl x").decision == "deny"


# -- Bash: rules per simple command --


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("npm run test", "allow"),
        ("npm run test -- --watch", "allow"),
        ("npm run test 2>&1 | tail -5", "allow"),
        ("cd web && npm run test", "allow"),
        ("npm run testing", "ask"),
        ("npm run test; curl x", "ask"),
        ("npm run test > out.txt", "ask"),
        ("npm run test $(rm -rf x)", "ask"),
        ("FOO=1 npm run test", "ask"),
        ("make check", "allow"),
        ("make check && ls", "allow"),
        ("make check -j4", "ask"),
    ],
)
def test_bash_allow_rules_cover_each_part(world: World, command: str, expected: str) -> None:
    engine = world.engine(("project", rules("allow", "Bash(npm run test:*)", "Bash(make check)")))
    decision = bash(engine, command)
    assert decision.decision == expected, decision
    if expected == "allow":
        assert not decision.concurrency_safe and not decision.run_read_only


def test_without_the_floor_read_only_parts_need_a_rule_too(world: World) -> None:
    engine = world.engine(("project", rules("allow", "Bash(npm run test:*)")), floor=False)
    assert bash(engine, "npm run test").decision == "allow"
    assert bash(engine, "npm run test | tail -5").decision == "ask"


def test_exact_rule_allows_the_whole_line_as_written(world: World) -> None:
    engine = world.engine(("user", rules("allow", "Bash(make lint | tee lint.log)")))
    assert bash(engine, "make lint | tee lint.log").decision == "allow"


@pytest.mark.parametrize(
    "command",
    [
        "curl x",
        "timeout 5 curl x",
        "/usr/bin/curl x",
        '"curl" x',
        "ls && curl x",
        "echo $(curl x)",
        "env A=1 curl x",
        "sudo -u bob curl x",
    ],
)
def test_bash_deny_rules_see_through_wrappers_and_parts(world: World, command: str) -> None:
    engine = world.engine(
        ("user", rules("deny", "Bash(curl:*)")), ("managed", rules("allow", "Bash"))
    )
    assert bash(engine, command).decision == "deny"


def test_a_read_only_command_allowed_by_a_rule_still_runs_read_only(world: World) -> None:
    engine = world.engine(("user", rules("allow", "Bash(git:*)")))
    decision = bash(engine, "git status")
    assert decision.decision == "allow" and decision.rule == "Bash(git:*)"
    assert decision.run_read_only and decision.concurrency_safe and decision.read_only


# -- the floor --


def test_with_the_floor_read_only_commands_run_read_only_in_parallel(world: World) -> None:
    decision = bash(world.engine(), "rg -n TODO src | head -20")
    assert (decision.decision, decision.rule, decision.source) == ("allow", "read-only", "built-in")
    assert decision.read_only and decision.concurrency_safe and decision.run_read_only
    assert decision.floor == "proven"


def test_without_the_floor_only_the_exact_list_is_allowed(world: World) -> None:
    engine = world.engine(floor=False)
    decision = bash(engine, "rg -n TODO src")
    assert decision.decision == "ask" and decision.read_only and decision.floor == "unproven"
    decision = bash(engine, "git status")
    assert decision.decision == "allow" and not decision.run_read_only


def test_writing_commands_ask(world: World) -> None:
    decision = bash(world.engine(), "rm -rf build")
    assert (decision.decision, decision.rule, decision.source) == ("ask", None, "built-in")
    assert not decision.read_only and not decision.concurrency_safe


def test_read_only_tools_are_allowed_and_others_ask(world: World) -> None:
    engine = world.engine()
    decision = call(engine, "Read", world.ws / "a.py")
    assert (decision.decision, decision.concurrency_safe, decision.run_read_only) == (
        "allow",
        True,
        False,
    )
    assert call(engine, "Edit", world.ws / "a.py").decision == "ask"
    assert engine.decide("Think", {"thought": "x"}, tool_read_only=True).decision == "allow"
    assert engine.decide("mcp__x__y", {}, tool_read_only=False).decision == "ask"


# -- built-in checks --


def test_critical_deletes_always_ask(world: World) -> None:
    allow_all: tuple[Level, str] = ("managed", rules("allow", "Bash"))
    for engine in (world.engine(allow_all), world.engine(("user", 'mode = "bypass"\n'), allow_all)):
        decision = bash(engine, "rm -rf /")
        assert (decision.decision, decision.rule) == ("ask", "critical delete")
        assert bash(engine, f"rm -rf {world.ws}").decision == "ask"
    dont_ask = world.engine(("user", 'mode = "dont-ask"\n'), allow_all)
    assert bash(dont_ask, "rm -rf ~").decision == "deny"
    denied = world.engine(("user", rules("deny", "Bash(rm:*)")))
    assert bash(denied, "rm -rf /").rule == "Bash(rm:*)"


@pytest.mark.parametrize(
    "relative", [".git/hooks/pre-commit", ".git/config", ".warren/policy.toml", ".envrc"]
)
def test_protected_paths_are_denied_even_in_bypass(world: World, relative: str) -> None:
    engine = world.engine(("user", 'mode = "bypass"\n' + rules("allow", "Edit")))
    decision = call(engine, "Write", world.ws / relative)
    assert (decision.decision, decision.rule) == ("deny", "protected path")
    assert "read-only" in decision.reason


def test_protected_additions_and_symlinks_into_protected_paths(world: World) -> None:
    (world.ws / ".git" / "hooks").mkdir(parents=True)
    (world.ws / "hooks").symlink_to(world.ws / ".git" / "hooks")
    engine = world.engine(("user", '[sandbox]\nprotected = ["scripts/release.sh"]\n'))
    assert call(engine, "Edit", world.ws / "scripts/release.sh").decision == "deny"
    assert call(engine, "Edit", world.ws / "hooks/post-checkout").decision == "deny"
    assert call(engine, "Edit", world.ws / "scripts/other.sh").decision == "ask"


def test_masked_secrets_are_denied(world: World) -> None:
    engine = world.engine(("user", '[sandbox]\ndeny_read = ["~/private", "{config}/tool"]\n'))
    for path in (
        world.home / ".ssh/id_ed25519",
        world.home / "private/notes.txt",
        world.home / ".config/tool/token",
        world.home / ".config/warren/policy.toml",  # Warren's own policy
        world.home / ".local/state/warren/trust.json",
    ):
        decision = call(engine, "Read", path)
        assert (decision.decision, decision.rule) == ("deny", "masked secret"), path
    assert call(engine, "Read", world.home / "public.txt").decision == "allow"


# -- paths: symlinks and anchors --


def test_deny_matches_a_symlink_pointing_into_a_denied_directory(world: World) -> None:
    secrets = world.ws / "secrets"
    secrets.mkdir()
    (secrets / "key").write_text("s3cret")
    (world.ws / "innocent.txt").symlink_to(secrets / "key")
    (world.ws / "docs").symlink_to(secrets)
    engine = world.engine(("project", rules("deny", "Read(secrets/**)")))
    for path in (world.ws / "innocent.txt", world.ws / "docs/key", secrets / "key"):
        decision = call(engine, "Read", path)
        assert (decision.decision, decision.rule) == ("deny", "Read(secrets/**)"), path
    assert call(engine, "Read", world.ws / "README.md").decision == "allow"
    # The family: Glob, Grep and LS on the directory are denied too.
    assert call(engine, "Grep", world.ws / "docs").decision == "deny"
    assert call(engine, "LS", secrets).decision == "deny"


def test_deny_matches_the_link_itself_when_its_target_is_elsewhere(world: World) -> None:
    (world.ws / "secrets").mkdir()
    (world.root / "elsewhere.txt").write_text("x")
    (world.ws / "secrets/link").symlink_to(world.root / "elsewhere.txt")
    engine = world.engine(("project", rules("deny", "Read(secrets/**)")))
    assert call(engine, "Read", world.ws / "secrets/link").decision == "deny"


def test_allow_uses_the_resolved_path(world: World) -> None:
    (world.ws / "src").mkdir()
    (world.root / "outside.py").write_text("")
    (world.ws / "src/escape.py").symlink_to(world.root / "outside.py")
    engine = world.engine(("project", rules("allow", "Edit(src/**)")))
    assert call(engine, "Edit", world.ws / "src/a.py").decision == "allow"
    assert call(engine, "Edit", world.ws / "src/escape.py").decision == "ask"
    assert call(engine, "Edit", world.ws / "src/../other.py").decision == "ask"


def test_path_rules_are_relative_to_their_file(world: World) -> None:
    user = rules("allow", "Edit(/notes/**)", "Edit(~/journal/**)", "Edit(//srv/data/**)")
    engine = world.engine(("user", user))
    assert call(engine, "Edit", world.user_dir / "notes/a.md").decision == "allow"
    assert call(engine, "Edit", world.ws / "notes/a.md").decision == "ask"
    assert call(engine, "Edit", world.home / "journal/2024.md").decision == "allow"
    assert call(engine, "Edit", Path("/srv/data/x.csv")).decision == "allow"
    project = world.engine(("project", rules("allow", "Edit(/notes/**)")))
    assert call(project, "Edit", world.ws / "notes/a.md").decision == "allow"


def test_path_rule_anchors_through_the_loader(world: World) -> None:
    managed = world.root / "etc/warren/policy.toml"
    managed.parent.mkdir(parents=True)
    managed.write_text(rules("allow", "Edit(/templates/**)"))
    (world.ws / ".warren").mkdir()
    (world.ws / ".warren/policy.toml").write_text(rules("allow", "Write(/build/**)"))
    store = TrustStore(world.root / "trust.json")
    store.trust(world.ws)
    policy = load_effective_policy(
        world.ws,
        paths=PolicyPaths.for_workspace(world.ws, env=world.env, managed=managed),
        trust_store=store,
        env=world.env,
    )
    engine = PolicyEngine(
        policy, workspace=world.ws, floor_proven=True, env=world.env, tool_facts=FACTS
    )
    assert call(engine, "Edit", managed.parent / "templates/t.md").decision == "allow"
    assert call(engine, "Edit", world.ws / "templates/t.md").decision == "ask"
    assert call(engine, "Write", world.ws / "build/out.js").decision == "allow"
    assert call(engine, "Edit", world.ws / "build/out.js").decision == "ask"  # Write only


def test_relative_paths_are_taken_from_the_workspace(world: World) -> None:
    engine = world.engine(("project", rules("allow", "Edit(src/**)")))
    assert call(engine, "Edit", "src/a.py").decision == "allow"


def test_glob_and_grep_without_a_path_search_the_workspace(world: World) -> None:
    engine = world.engine(("project", rules("deny", "Read(//**)")))
    assert engine.decide("Glob", {"pattern": "*.py"}, tool_read_only=True).decision == "deny"


def test_agent_and_mcp_rules(world: World) -> None:
    engine = world.engine(
        ("user", rules("allow", "dispatch_agent(reviewer)") + 'deny = ["mcp__slack"]\n')
    )
    decide = engine.decide
    assert (
        decide("dispatch_agent", {"subagent_type": "reviewer"}, tool_read_only=False).decision
        == "allow"
    )
    assert (
        decide("dispatch_agent", {"subagent_type": "coder"}, tool_read_only=False).decision == "ask"
    )
    assert decide("mcp__slack__post", {}, tool_read_only=False).decision == "deny"
    assert decide("mcp__github__issue", {}, tool_read_only=False).decision == "ask"


# -- modes --


def test_default_mode(world: World) -> None:
    engine = world.engine()
    assert engine.mode == "default"
    assert call(engine, "Edit", world.ws / "a.py").decision == "ask"


def test_accept_edits_mode(world: World) -> None:
    shared = world.root / "shared"
    engine = world.engine(
        (
            "user",
            'mode = "accept-edits"\n[sandbox]\nwritable_roots = ["//' + str(shared)[1:] + '"]\n',
        )
    )
    decision = call(engine, "Edit", world.ws / "src/a.py")
    assert (decision.decision, decision.rule, decision.source) == (
        "allow",
        "accept-edits mode",
        "mode",
    )
    assert call(engine, "NotebookEdit", world.ws / "n.ipynb").decision == "allow"
    assert call(engine, "Write", shared / "x.txt").decision == "allow"
    assert call(engine, "Write", world.root / "elsewhere.txt").decision == "ask"
    assert call(engine, "Write", world.ws / ".warren/policy.toml").decision == "deny"
    assert bash(engine, "touch x").decision == "ask"


def test_plan_mode(world: World) -> None:
    engine = world.engine(
        (
            "user",
            'mode = "plan"\n' + rules("allow", "Bash(make:*)", "Edit") + 'ask = ["Read(.env)"]\n',
        )
    )
    decision = call(engine, "Edit", world.ws / "a.py")
    assert (decision.decision, decision.rule, decision.source) == ("deny", "plan mode", "mode")
    assert "Plan mode" in decision.reason
    assert bash(engine, "make build").decision == "deny"
    assert bash(engine, "ls -la src").decision == "allow"
    assert call(engine, "Read", world.ws / "a.py").decision == "allow"
    assert call(engine, "Read", world.ws / ".env").decision == "ask"


def test_dont_ask_mode(world: World) -> None:
    engine = world.engine(
        ("user", 'mode = "dont-ask"\n' + rules("allow", "Edit(src/**)") + 'ask = ["Read(.env)"]\n')
    )
    decision = call(engine, "Edit", world.ws / "a.py")
    assert decision.decision == "deny" and "dont-ask" in decision.reason
    assert call(engine, "Read", world.ws / ".env").decision == "deny"
    assert call(engine, "Edit", world.ws / "src/a.py").decision == "allow"
    assert bash(engine, "ls").decision == "allow"


def test_bypass_mode(world: World) -> None:
    engine = world.engine(
        (
            "user",
            'mode = "bypass"\n' + rules("deny", "Bash(curl:*)") + 'ask = ["Bash(git push:*)"]\n',
        )
    )
    decision = bash(engine, "make deploy")
    assert (decision.decision, decision.rule, decision.source) == ("allow", "bypass mode", "mode")
    assert bash(engine, "git push").decision == "allow"  # ask rules are bypassed
    assert bash(engine, "curl x").decision == "deny"
    assert call(engine, "Edit", world.root / "outside.txt").decision == "allow"
    assert bash(engine, "ls").run_read_only


def test_bypass_refuses_to_start_without_the_floor(world: World) -> None:
    with pytest.raises(BypassRefused) as info:
        world.engine(("local", 'mode = "bypass"\n'), floor=False)
    assert (info.value.file, info.value.key) == ("local.toml", "mode")
    assert "--i-know-there-is-no-sandbox" in info.value.message
    engine = world.engine(("local", 'mode = "bypass"\n'), floor=False, consent=True)
    assert bash(engine, "make").decision == "allow"
    assert bash(engine, "ls").decision == "allow" and not bash(engine, "ls").run_read_only


# -- remembering --


def test_remember_returns_the_rule_and_allows_it_for_the_session(world: World) -> None:
    engine = world.engine()
    assert bash(engine, "npm run test").decision == "ask"
    assert engine.remember("Bash", {"command": "npm run test --watch"}) == "Bash(npm run test:*)"
    decision = bash(engine, "npm run test")
    assert (decision.decision, decision.source) == ("allow", "session")
    rule = engine.remember("Edit", {"file_path": str(world.ws / "src/a[1].py")})
    assert rule == "Edit(/src/a\\[1].py)"
    assert call(engine, "Edit", world.ws / "src/a[1].py").decision == "allow"
    assert call(engine, "Edit", world.ws / "src/a1.py").decision == "ask"
    assert engine.remember("Write", {"file_path": "/srv/x.txt"}) == "Write(//srv/x.txt)"
    assert engine.remember("dispatch_agent", {"subagent_type": "reviewer"}) == (
        "dispatch_agent(reviewer)"
    )
    assert engine.remember("dispatch_agent", {}) == "dispatch_agent(general)"
    assert engine.remember("mcp__x__y", {}) == "mcp__x__y"


def test_a_remembered_rule_persists_and_loads(world: World) -> None:
    engine = world.engine()
    rule = engine.remember("Bash", {"command": "make check"})
    store = TrustStore(world.root / "trust.json")
    save_remembered_rule(world.ws, rule, trust_store=store)
    policy = load_effective_policy(
        world.ws,
        paths=PolicyPaths.for_workspace(world.ws, env=world.env, managed=None),
        trust_store=store,
        env=world.env,
    )
    fresh = PolicyEngine(
        policy, workspace=world.ws, floor_proven=True, env=world.env, tool_facts=FACTS
    )
    decision = bash(fresh, "make check")
    assert decision.decision == "allow"
    assert decision.source == str(world.ws / ".warren/policy.local.toml")


# -- values and audit --


def test_decision_is_frozen_and_audit_fields(world: World) -> None:
    input: Mapping[str, Any] = {"command": "ls -la"}
    decision = bash(world.engine(), "ls -la")
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.decision = "deny"  # type: ignore[misc]
    fields = audit_fields(decision, "Bash", input)
    digest = hashlib.sha256(json.dumps(dict(input), sort_keys=True).encode()).hexdigest()[:16]
    assert fields == {
        "tool": "Bash",
        "input_digest": digest,
        "decision": "allow",
        "rule": "read-only",
        "source": "built-in",
        "mode": "default",
        "floor": "proven",
        "run_read_only": True,
    }


def test_odd_inputs_never_raise(world: World) -> None:
    engine = world.engine(("user", rules("deny", "Read(secrets/**)", "Bash(rm:*)")))
    odd: list[tuple[str, dict[str, Any]]] = [
        ("Bash", {}),
        ("Bash", {"command": 5}),
        ("Bash", {"command": "x" * 20_000}),
        ("Read", {}),
        ("Read", {"file_path": None}),
        ("Read", {"file_path": "a\x00b"}),
        ("Edit", {"file_path": ""}),
        ("dispatch_agent", {"subagent_type": 3}),
    ]
    for tool, input in odd:
        assert engine.decide(tool, input, tool_read_only=False).decision in ("allow", "ask", "deny")


# -- the property: a deny rule never turns anything into allow --

RULE_POOL = [
    "Bash",
    "Bash(npm run test:*)",
    "Bash(make check)",
    "Bash(rm:*)",
    "Bash(git:*)",
    "Bash(ls:*)",
    "Bash(curl:*)",
    "Edit",
    "Edit(src/**)",
    "Edit(/docs/**)",
    "Write(*.md)",
    "Read",
    "Read(secrets/**)",
    "Read(//etc/**)",
    "Glob",
    "dispatch_agent(reviewer)",
    "mcp__srv",
]
WS = Path("/nonexistent/ws")
CALL_POOL: list[tuple[str, dict[str, Any]]] = [
    *(
        ("Bash", {"command": command})
        for command in [
            "npm run test",
            "npm run test | tail -3",
            "make check && ls",
            "rm -rf build",
            "rm -rf /",
            "ls -la",
            "git status",
            "git push",
            "cat secrets/key",
            "echo $(curl x)",
        ]
    ),
    ("Edit", {"file_path": f"{WS}/src/a.py"}),
    ("Edit", {"file_path": f"{WS}/docs/x.md"}),
    ("Write", {"file_path": f"{WS}/README.md"}),
    ("Edit", {"file_path": f"{WS}/.git/hooks/x"}),
    ("Read", {"file_path": f"{WS}/secrets/k"}),
    ("Read", {"file_path": "/etc/passwd"}),
    ("Glob", {"pattern": "*"}),
    ("LS", {"path": f"{WS}/src"}),
    ("dispatch_agent", {"subagent_type": "reviewer"}),
    ("mcp__srv__x", {}),
    ("Think", {"thought": "x"}),
]
LEVEL_POOL: list[Level] = ["built-in", "user", "project", "local", "command line", "managed"]
MODE_POOL = ["default", "accept-edits", "plan", "dont-ask", "bypass"]

placed_rules = st.lists(
    st.tuples(
        st.sampled_from(LEVEL_POOL),
        st.sampled_from(["allow", "ask", "deny"]),
        st.sampled_from(RULE_POOL),
    ),
    max_size=6,
)


def build(
    placed: list[tuple[Level, str, str]], mode: str, floor: bool, untrusted: bool
) -> PolicyEngine:
    layers = []
    for level in LEVEL_POOL:
        sections: dict[str, list[str]] = {"allow": [], "ask": [], "deny": []}
        for rule_level, kind, rule in placed:
            if rule_level == level:
                sections[kind].append(rule)
        text = ("mode = " + json.dumps(mode) + "\n" if level == "user" else "") + (
            "[permissions]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in sections.items())
        )
        trusted = not (untrusted and level in ("project", "local"))
        layers.append(
            PolicyLayer(level, level, parse_policy_text(text, file=level), WS, trusted=trusted)
        )
    policy = merge_policy(WS, layers, home=Path("/nonexistent/home"))
    return PolicyEngine(
        policy,
        workspace=WS,
        floor_proven=floor,
        analyser=ANALYSER,
        no_sandbox_consent=True,
        env={"HOME": "/nonexistent/home"},
        tool_facts=FACTS,
    )


@settings(max_examples=300, deadline=None)
@given(
    placed=placed_rules,
    extra_level=st.sampled_from(LEVEL_POOL),
    extra_rule=st.sampled_from(RULE_POOL),
    mode=st.sampled_from(MODE_POOL),
    floor=st.booleans(),
    untrusted=st.booleans(),
    index=st.integers(min_value=0, max_value=len(CALL_POOL) - 1),
)
def test_adding_a_deny_rule_never_turns_a_decision_into_allow(
    placed: list[tuple[Level, str, str]],
    extra_level: Level,
    extra_rule: str,
    mode: str,
    floor: bool,
    untrusted: bool,
    index: int,
) -> None:
    tool, input = CALL_POOL[index]
    read_only = tool in READ_ONLY_TOOLS
    before = build(placed, mode, floor, untrusted).decide(tool, input, tool_read_only=read_only)
    after_engine = build([*placed, (extra_level, "deny", extra_rule)], mode, floor, untrusted)
    after = after_engine.decide(tool, input, tool_read_only=read_only)
    if after.decision == "allow":
        assert before.decision == "allow", (before, after)
    if before.decision == "deny":
        assert after.decision == "deny", (before, after)
