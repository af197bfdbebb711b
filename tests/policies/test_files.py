"""Policy files: schema, located errors, the six levels and their precedence, the writer.

The fuzz tests pin the loader's promise: whatever bytes a policy file holds, loading it
either succeeds or raises one `PolicyError` that names the file and a location.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.files import (
    EffectivePolicy,
    PolicyError,
    PolicyFile,
    PolicyLayer,
    PolicyPaths,
    append_allow_rule,
    command_line_policy,
    load_effective_policy,
    load_policy_file,
    merge_policy,
    parse_policy_text,
    split_tool_list,
    toml_string,
)
from policies.trust import TrustStore

FULL = """\
mode = "accept-edits"

[permissions]
allow = ["Bash(npm run test:*)", "Edit(src/**)"]
ask = ["Bash(git push:*)"]
deny = ["Read(.env)", "mcp__slack"]

[sandbox]
deny_read = ["~/.config/acme"]
protected = ["scripts/release.sh"]
writable_roots = ["../shared"]

[limits]
max_turns = 50
max_subagents = 4
max_concurrency = 8
tool_timeout_s = 120

[[hooks]]
event = "PreToolUse"
matcher = "Bash(git commit:*)"
command = "make lint"

[[hooks]]
event = "Stop"
command = "notify-send done"
timeout_s = 5

[[examples]]
tool = "Bash"
command = "rm -rf build"
decision = "ask"

[[examples]]
tool = "Edit"
path = "src/a.py"
decision = "allow"

[[examples]]
tool = "dispatch_agent"
input = { subagent_type = "reviewer", prompt = "x", description = "y" }
decision = "ask"
floor = true
"""


class Levels:
    """A workspace plus user, managed, state and home directories under tmp_path."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.workspace = root / "repo"
        (self.workspace / ".warren").mkdir(parents=True)
        self.home = root / "home"
        self.home.mkdir()
        self.env = {
            "HOME": str(self.home),
            "XDG_CONFIG_HOME": str(root / "config"),
            "XDG_STATE_HOME": str(root / "state"),
        }
        self.store = TrustStore.from_env(self.env)
        self.managed = root / "etc" / "policy.toml"
        self.paths = PolicyPaths.for_workspace(self.workspace, env=self.env, managed=self.managed)

    def write(self, level: str, text: str) -> Path:
        path: Path | None = {
            "user": self.paths.user,
            "project": self.paths.project,
            "local": self.paths.local,
            "managed": self.managed,
        }[level]
        assert path is not None
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path

    def load(self, command_line: PolicyFile | None = None) -> EffectivePolicy:
        return load_effective_policy(
            self.workspace,
            command_line=command_line,
            paths=self.paths,
            trust_store=self.store,
            env=self.env,
        )

    def trust(self) -> None:
        self.store.trust(self.workspace)


@pytest.fixture
def levels(tmp_path: Path) -> Levels:
    return Levels(tmp_path)


# -- schema --


def test_full_file_parses() -> None:
    policy = parse_policy_text(FULL, file="p.toml")
    assert policy.mode == "accept-edits"
    assert policy.permissions.deny == ("Read(.env)", "mcp__slack")
    assert policy.limits.tool_timeout_s == 120.0
    assert [hook.event for hook in policy.hooks] == ["PreToolUse", "Stop"]
    assert policy.hooks[1].timeout_s == 5
    assert [example.decision for example in policy.examples] == ["ask", "allow", "ask"]
    assert policy.examples[2].input == {
        "subagent_type": "reviewer",
        "prompt": "x",
        "description": "y",
    }


def test_bundled_defaults_load() -> None:
    policy = load_effective_policy(
        Path("/nonexistent/repo"),
        paths=PolicyPaths(
            user=None, project=Path("/nonexistent/p"), local=Path("/nonexistent/l"), managed=None
        ),
        trust_store=TrustStore(Path("/nonexistent/trust.json")),
        env={"HOME": "/nonexistent/home"},
    )
    assert policy.mode == "default" and policy.mode_source == "built-in"
    assert policy.limit("max_turns") == 100
    assert [layer.level for layer in policy.layers] == ["built-in"]


def located(text: str) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        parse_policy_text(text, file="/x/policy.toml")
    assert info.value.file == "/x/policy.toml"
    return info.value


def test_syntax_error_has_its_line() -> None:
    err = located('mode = "default"\n\n[permissions]\nallow = ["Bash(ls)"\ndeny = []\n')
    assert err.line == 5
    assert "TOML syntax error" in err.message
    assert str(err).startswith("/x/policy.toml:5: ")


def test_syntax_error_at_the_end() -> None:
    err = located('mode = "default"\n[permissions]\nallow = [\n')
    assert err.line == 3
    assert "end of the file" in err.message


def test_duplicate_key_is_a_syntax_error_with_line() -> None:
    err = located("[limits]\nmax_turns = 1\nmax_turns = 2\n[permissions]\n")
    assert err.line is not None and err.line >= 3


def test_unknown_top_level_key_has_its_line() -> None:
    err = located('mode = "default"\n\n# comment\nmodee = "plan"\n')
    assert (err.line, err.key) == (4, "modee")
    assert "unknown key `modee`" in err.message and "permissions" in err.message


def test_unknown_key_in_a_table_has_its_line() -> None:
    err = located("[permissions]\nallow = []\n\n[limits]\nmax_turns = 3\nmax_turn = 4\n")
    assert (err.line, err.key) == (6, "limits.max_turn")
    assert "max_turns" in err.message  # the known keys are listed


def test_unknown_table_has_its_line() -> None:
    err = located('mode = "plan"\n[permission]\nallow = []\n')
    assert (err.line, err.key) == (2, "permission")


def test_bad_rule_in_a_multiline_array_points_at_the_element() -> None:
    text = '[permissions]\nallow = [\n    "Bash(ls)",\n    "Edit(src/**)",\n    "Bash(",\n]\n'
    err = located(text)
    assert (err.line, err.key) == (5, "permissions.allow[2]")
    assert "is not a rule" in err.message


def test_bad_value_in_the_second_example_table() -> None:
    text = (
        '[[examples]]\ntool = "Bash"\ncommand = "ls"\ndecision = "allow"\n\n'
        '[[examples]]\ntool = "Bash"\ncommand = "ls"\ndecision = "maybe"\n'
    )
    err = located(text)
    assert (err.line, err.key) == (9, "examples[1].decision")


def test_example_shape_is_checked() -> None:
    err = located('[[examples]]\ntool = "Bash"\npath = "a"\ndecision = "allow"\n')
    assert err.line == 1 and err.key == "examples[0]"
    assert "needs `command`" in err.message


def test_wrong_types_and_ranges() -> None:
    assert located('[limits]\nmax_turns = "5"\n').line == 2
    assert located("[limits]\nmax_turns = 0\n").key == "limits.max_turns"
    assert located("[limits]\nmax_subagents = 65\n").line == 2  # 11 to 64: on a Ray pool
    assert located("[limits]\ntool_timeout_s = inf\n").line == 2
    assert located("[limits]\ntool_timeout_s = nan\n").line == 2
    assert located('mode = "yolo"\n').key == "mode"
    assert located('[permissions]\nallow = "Bash"\n').key == "permissions.allow"


def test_hook_matcher_only_for_tool_events() -> None:
    err = located('[[hooks]]\nevent = "Stop"\nmatcher = "Bash"\ncommand = "x"\n')
    assert err.line == 1 and "matcher" in err.message
    err = located('[[hooks]]\nevent = "PreToolUse"\nmatcher = "Bash("\ncommand = "x"\n')
    assert err.line == 3


def test_the_first_error_in_the_file_is_reported() -> None:
    err = located("modee = 1\n[limits]\nmax_turns = -1\n")
    assert err.line == 1


def test_not_utf8_has_a_line(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_bytes(b'mode = "default"\n# caf\xe9\n')
    with pytest.raises(PolicyError) as info:
        load_policy_file(path)
    assert (info.value.file, info.value.line) == (str(path), 2)


def test_unreadable_file_is_a_policy_error(tmp_path: Path) -> None:
    (tmp_path / "policy.toml").mkdir()
    with pytest.raises(PolicyError) as info:
        load_policy_file(tmp_path / "policy.toml")
    assert info.value.file == str(tmp_path / "policy.toml")
    assert load_policy_file(tmp_path / "missing.toml") is None


def test_deep_nesting_is_a_policy_error() -> None:
    with pytest.raises(PolicyError):
        parse_policy_text("a = " + "[" * 5000 + "]" * 5000, file="deep.toml")


# -- levels and precedence --


def test_mode_local_over_project_over_user_over_defaults(levels: Levels) -> None:
    levels.trust()
    assert levels.load().mode == "default"
    user = levels.write("user", 'mode = "plan"\n')
    assert (levels.load().mode, levels.load().mode_source) == ("plan", str(user))
    project = levels.write("project", 'mode = "accept-edits"\n')
    levels.trust()
    assert (levels.load().mode, levels.load().mode_source) == ("accept-edits", str(project))
    local = levels.write("local", 'mode = "dont-ask"\n')
    levels.trust()
    assert (levels.load().mode, levels.load().mode_source) == ("dont-ask", str(local))
    command_line = command_line_policy(permission_mode="plan")
    assert levels.load(command_line).mode_source == "command line"


def test_managed_beats_everything(levels: Levels) -> None:
    levels.write("user", 'mode = "bypass"\n[limits]\nmax_turns = 7\n')
    levels.write("project", 'mode = "bypass"\n[limits]\nmax_turns = 8\n')
    levels.write("local", 'mode = "bypass"\n[limits]\nmax_turns = 9\n')
    managed = levels.write("managed", 'mode = "plan"\n[limits]\nmax_turns = 3\n')
    levels.trust()
    policy = levels.load(command_line_policy(permission_mode="bypass"))
    assert (policy.mode, policy.mode_source) == ("plan", str(managed))
    assert policy.limits["max_turns"].value == 3
    assert policy.limits["max_turns"].source == str(managed)
    assert policy.layers[-1].level == "managed"
    assert policy.rules == () or policy.rules[0].level == "managed"


def test_limits_come_from_the_highest_level_that_sets_each(levels: Levels) -> None:
    user = levels.write("user", "[limits]\nmax_turns = 7\nmax_subagents = 2\n")
    levels.write("managed", "[limits]\nmax_subagents = 1\n")
    policy = levels.load()
    assert policy.limits["max_turns"].source == str(user)
    assert policy.limit("max_subagents") == 1
    assert policy.limits["tool_timeout_s"].source == "built-in"


def test_rules_are_ordered_highest_level_first(levels: Levels) -> None:
    levels.write("user", '[permissions]\ndeny = ["Bash(a)"]\n')
    levels.write("managed", '[permissions]\ndeny = ["Bash(b)"]\n')
    policy = levels.load(command_line_policy(disallowed_tools=["Bash(c)"]))
    assert [(rule.level, rule.text) for rule in policy.rules] == [
        ("managed", "Bash(b)"),
        ("command line", "Bash(c)"),
        ("user", "Bash(a)"),
    ]


def test_untrusted_project_keeps_only_what_tightens(levels: Levels) -> None:
    levels.write("project", FULL)
    policy = levels.load()
    assert policy.trust == "untrusted"
    assert policy.mode == "default"  # the project's accept-edits waits for trust
    assert policy.limit("max_turns") == 100
    assert policy.writable_roots == () and policy.hooks == ()
    active = {(rule.kind, rule.text) for rule in policy.rules if rule.active}
    assert ("deny", "Read(.env)") in active and ("ask", "Bash(git push:*)") in active
    assert ("allow", "Edit(src/**)") not in active
    assert ("~/.config/acme", str(levels.paths.project)) in policy.deny_read
    assert len(policy.examples) == 3
    levels.trust()
    trusted = levels.load()
    assert trusted.trust == "trusted" and trusted.mode == "accept-edits"
    assert all(rule.active for rule in trusted.rules)
    assert trusted.writable_roots == ((levels.root / "shared", str(levels.paths.project)),)
    assert len(trusted.hooks) == 2


def test_user_file_honours_xdg_config_home(levels: Levels) -> None:
    assert levels.paths.user == levels.root / "config" / "warren" / "policy.toml"
    fallback = PolicyPaths.for_workspace(levels.workspace, env={"HOME": "/h"})
    assert fallback.user == Path("/h/.config/warren/policy.toml")
    assert fallback.project == levels.workspace / ".warren" / "policy.toml"
    assert fallback.local == levels.workspace / ".warren" / "policy.local.toml"


def test_a_broken_level_fails_the_whole_load(levels: Levels) -> None:
    levels.write("user", 'mode = "plan"\n')
    local = levels.write("local", "[permissions]\nallow = [\n  'Bash(',\n]\n")
    with pytest.raises(PolicyError) as info:
        levels.load()
    assert (info.value.file, info.value.line) == (str(local), 3)


def test_merge_is_pure() -> None:
    layer = PolicyLayer("user", "u.toml", PolicyFile(mode="plan"), Path("/u"))
    policy = merge_policy(Path("/w"), [layer], home=Path("/h"))
    assert (policy.mode, policy.mode_source, policy.trust) == (
        "plan",
        "u.toml",
        "no project policy",
    )


# -- the command line --


def test_split_tool_list_keeps_parentheses() -> None:
    assert split_tool_list(["Bash(npm run test:*), Edit", "Read  Write,Glob"]) == (
        "Bash(npm run test:*)",
        "Edit",
        "Read",
        "Write",
        "Glob",
    )


def test_command_line_policy() -> None:
    policy = command_line_policy(
        allowed_tools=["Bash(make check) Edit"],
        disallowed_tools=["WebFetch"],
        permission_mode="acceptEdits",
    )
    assert policy.mode == "accept-edits"
    assert policy.permissions.allow == ("Bash(make check)", "Edit")
    assert policy.permissions.deny == ("WebFetch",)
    with pytest.raises(PolicyError) as info:
        command_line_policy(allowed_tools=["Bash("])
    assert (info.value.file, info.value.key) == ("command line", "--allowed-tools")
    with pytest.raises(PolicyError) as info:
        command_line_policy(permission_mode="yolo")
    assert info.value.key == "--permission-mode"


# -- appending a remembered rule --


def appended(tmp_path: Path, text: str | None, rule: str) -> str:
    path = tmp_path / "policy.local.toml"
    if text is not None:
        path.write_text(text, encoding="utf-8")
    before = parse_policy_text(text, file="x") if text else PolicyFile()
    assert append_allow_rule(path, rule)
    result = path.read_text(encoding="utf-8")
    after = parse_policy_text(result, file="x")
    assert after.permissions.allow == (*before.permissions.allow, rule)
    assert after.permissions.deny == before.permissions.deny
    return result


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "# just a comment\n",
        'mode = "plan"',
        '[permissions]\ndeny = ["Bash(curl:*)"]\n',
        "[permissions]\nallow = []\n",
        "[permissions]\nallow = [ ]  # nothing yet\n",
        '[permissions]\nallow = ["Bash(ls)"]\n',
        '[permissions]\nallow = ["Bash(ls)",]\n',
        '[permissions]\nallow = [\n  "Bash(ls)",  # a comment with ] and "quotes"\n'
        '  "Edit(x)"\n]\n',
        '[permissions]\nallow = [\n  "Bash(ls)",\n  # "Bash(old)",\n]\n[limits]\nmax_turns = 3\n',
        '[permissions]\nallow = [\'Bash(echo "]")\', "Bash(a\\\\\\"])"]\n',
        'permissions.allow = ["Bash(ls)"]\n',
        '[limits]\nmax_turns = 3\n\n[[examples]]\ntool = "Bash"\ncommand = "ls"\n'
        'decision = "allow"\n',
        '[permissions]\nallow = ["Bash(ls)"]\n[[examples]]\ntool = "Bash"\ncommand = "ls"\n'
        'decision = "allow"\n',
    ],
)
def test_append_allow_rule_keeps_the_file_valid(tmp_path: Path, text: str | None) -> None:
    result = appended(tmp_path, text, 'Bash(echo "a\\b" | tr a-z A-Z)')
    if text and "#" in text:
        assert "#" in result  # comments survive


def test_append_allow_rule_is_idempotent_and_atomic(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    assert append_allow_rule(path, "Bash(make check)")
    assert not append_allow_rule(path, "Bash(make check)")
    assert [p.name for p in tmp_path.iterdir()] == ["p.toml"]


def test_append_allow_rule_refuses_what_it_cannot_edit(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('permissions = { deny = ["Bash(x)"] }\n', encoding="utf-8")
    with pytest.raises(PolicyError):
        append_allow_rule(path, "Bash(")
    assert path.read_text(encoding="utf-8") == 'permissions = { deny = ["Bash(x)"] }\n'
    # an inline table is edited in place now (tomlkit), not refused
    assert append_allow_rule(path, "Bash(ls)")
    policy = parse_policy_text(path.read_text(encoding="utf-8"), file="x")
    assert policy.permissions.allow == ("Bash(ls)",)
    assert policy.permissions.deny == ("Bash(x)",)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("# mine\nmode = \n", 2),
        ('# mine\n[permissions]\nallow = ["Bash(ls)"\n', 3),
        ("# mine\n[permissions]\nallow = [1]\n", 3),
        ('# mine\n[permissions]\nallow = ["Bash("]\n', 3),
        ("# mine\nmode = 'yolo'\n", 2),
    ],
)
def test_a_malformed_file_is_a_located_error_and_stays_unchanged(
    tmp_path: Path, text: str, line: int
) -> None:
    path = tmp_path / "policy.local.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PolicyError) as info:
        append_allow_rule(path, "Bash(make check)")
    assert (info.value.file, info.value.line) == (str(path), line)
    assert path.read_text(encoding="utf-8") == text
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_every_comment_and_line_of_the_file_is_kept(tmp_path: Path) -> None:
    text = (
        "# Warren policy, my notes\n"
        'mode = "default"  # keep asking\n'
        "\n"
        "[permissions]\n"
        "# why these:\n"
        "allow = [\n"
        '    "Bash(ls)",  # listing\n'
        '    # "Bash(rm:*)",  disabled\n'
        "]\n"
        'deny = ["Read(.env)"]  # secrets\n'
        "\n"
        "[limits]\n"
        "max_turns = 30 # enough\n"
    )
    result = appended(tmp_path, text, "Bash(make check)")
    kept = [line for line in text.splitlines() if line != "]"]
    for line in kept:
        assert line in result.splitlines(), line
    assert result.index('"Bash(make check)"') < result.index("deny = ")


def test_a_new_local_file_gets_a_header_and_one_rule_per_line(tmp_path: Path) -> None:
    result = appended(tmp_path, None, "Bash(make check)")
    assert result.startswith("# Warren: this repository's policy for you alone")
    assert '\n[permissions]\nallow = [\n    "Bash(make check)",\n]\n' in result


def test_the_file_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("[permissions]\n", encoding="utf-8")
    path.chmod(0o600)
    assert append_allow_rule(path, "Bash(ls)")
    assert path.stat().st_mode & 0o777 == 0o600
    fresh = tmp_path / "new.toml"
    assert append_allow_rule(fresh, "Bash(ls)")
    assert fresh.stat().st_mode & 0o777 == 0o644


def test_a_failed_write_changes_nothing(tmp_path: Path) -> None:
    """The disk refuses the bytes (RLIMIT_FSIZE stands in for a full disk): the old file is
    byte-identical, no temporary file is left, and the error says nothing changed."""
    import resource
    import signal

    path = tmp_path / "p.toml"
    text = (
        "# mine\n[permissions]\nallow = [\n"
        + "".join(f'    "Bash(make t{i})",\n' for i in range(20))
        + "]\n"
    )
    path.write_text(text, encoding="utf-8")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(text), hard))
    try:
        with pytest.raises(PolicyError) as info:
            append_allow_rule(path, "Bash(make check)")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert "nothing changed" in str(info.value)
    assert path.read_text(encoding="utf-8") == text
    assert [p.name for p in tmp_path.iterdir()] == ["p.toml"]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_toml_string_round_trips(text: str) -> None:
    assert tomllib.loads(f"v = {toml_string(text)}")["v"] == text


# -- fuzz: never crash, always located --

SCHEMA_KEYS = st.sampled_from(
    [
        "mode",
        "permissions",
        "allow",
        "ask",
        "deny",
        "sandbox",
        "limits",
        "max_turns",
        "hooks",
        "examples",
        "tool",
        "command",
        "decision",
        "path",
        "event",
        "deny_read",
        "tool_timeout_s",
        "x",
        "a-b",
        "input",
    ]
)
SCALARS = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["Bash(ls)", "Bash(", "Edit(src/**)", "default", "plan", "allow", "Stop"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(SCHEMA_KEYS, inner, max_size=4)
    ),
    max_leaves=12,
)
DOCUMENTS = st.dictionaries(SCHEMA_KEYS, VALUES, max_size=6)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    assert isinstance(value, dict)
    return "{" + ", ".join(f"{key} = {_toml_value(item)}" for key, item in value.items()) + "}"


def to_toml(document: dict[str, object]) -> str:
    """Scalars and arrays first, then tables as `[name]` and lists of tables as `[[name]]`."""
    lines, tables = [], []
    for key, value in document.items():
        if isinstance(value, dict):
            tables.append(f"\n[{key}]")
            tables.extend(f"{k} = {_toml_value(v)}" for k, v in value.items())
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for item in value:
                assert isinstance(item, dict)
                tables.append(f"\n[[{key}]]")
                tables.extend(f"{k} = {_toml_value(v)}" for k, v in item.items())
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines + tables) + "\n"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(DOCUMENTS)
def test_fuzz_valid_toml_loads_or_is_located(document: dict[str, object]) -> None:
    text = to_toml(document)
    assert tomllib.loads(text) is not None  # the generator writes valid TOML
    try:
        parse_policy_text(text, file="fuzz.toml")
    except PolicyError as err:
        assert err.file == "fuzz.toml"
        assert err.key, text
        assert err.line is not None and 1 <= err.line <= text.count("\n"), (text, err)


TOMLISH = st.text(
    alphabet=st.sampled_from([*"[]{}=.\"'#,\n \tabcmodeplnw_-019\\:*()", "\x00", "é"]),
    max_size=80,
)


@settings(max_examples=600, deadline=None)
@given(st.one_of(TOMLISH, st.text(max_size=80)))
def test_fuzz_any_text_loads_or_is_located(text: str) -> None:
    try:
        parse_policy_text(text, file="fuzz.toml")
    except PolicyError as err:
        assert err.file == "fuzz.toml"
        assert err.line is not None or err.key is not None, (text, err)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=60))
def test_fuzz_any_bytes_load_or_are_located(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "policy.toml"
    path.write_bytes(data)
    try:
        load_policy_file(path)
    except PolicyError as err:
        assert err.file == str(path)
        assert err.line is not None or err.key is not None, (data, err)


# -- a bad glob through the real CLI (issue 10 acceptance) --


@pytest.mark.parametrize(
    ("args", "rule"),
    [
        (["policy", "check", "--cwd", "{repo}", "--", "cat", "x"], "Read([z-a])"),
        (["policy", "check", "--cwd", "{repo}", "--", "cat", "x"], "Edit(src/[?-.].py)"),
        (["policy", "check", "--cwd", "{repo}", "--", "cat", "x"], "Grep([!z-a])"),
        (["-p", "read x", "--output-format", "json", "--cwd", "{repo}"], "Read([z-a])"),
    ],
)
def test_a_reversed_range_stops_the_cli_with_one_located_line(
    tmp_path: Path, args: list[str], rule: str
) -> None:
    """`deny = ["Read([z-a])"]` once crashed with a traceback and, with wcmatch, would be a
    rule that silently matches nothing: it is exit 2 and one line naming file and line."""
    import os
    import subprocess
    import sys

    repo = tmp_path / "repo"
    (repo / ".warren").mkdir(parents=True)
    policy = repo / ".warren" / "policy.toml"
    policy.write_text(
        f'# the project\'s policy\n[permissions]\ndeny = [\n  "Read(.env)",\n  "{rule}",\n]\n'
    )
    env = {
        **os.environ,
        "HOME": str(tmp_path / "home"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "ANTHROPIC_API_KEY": "sk-never-used",
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",  # nothing listens: no request may be sent
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *(a.format(repo=repo) for a in args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    output = (done.stdout + done.stderr).strip()
    assert "Traceback" not in output
    assert len(output.splitlines()) == 1, output
    assert f"{policy}:5:" in output and "permissions.deny[1]" in output
    assert "not a valid glob" in output and "reversed" in output
