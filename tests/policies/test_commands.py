"""`warren policy check|show|test|init|trust|untrust`, through their functions.

Imported as a module (`commands.test` would otherwise be collected as a test).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.tools.registry import builtin_facts
from policies import commands
from policies.commands import CommandEnvironment, CommandReport, check_target
from policies.files import PolicyError, command_line_policy, load_policy_file
from policies.trust import TrustStore, project_policy_hash


class Setup:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.repo = self.root / "repo"
        (self.repo / ".warren").mkdir(parents=True)
        self.env = {
            "HOME": str(self.root / "home"),
            "XDG_CONFIG_HOME": str(self.root / "config"),
            "XDG_STATE_HOME": str(self.root / "state"),
        }
        self.store = TrustStore.from_env(self.env)
        self.probes = 0
        self.text = ""

    def probe(self) -> bool:
        self.probes += 1
        return True

    def environment(self, **changes: object) -> CommandEnvironment:
        return CommandEnvironment(
            env=self.env,
            managed=self.root / "etc/policy.toml",
            trust_store=self.store,
            probe=self.probe,
            tool_facts=builtin_facts(),
            **changes,  # type: ignore[arg-type]
        )

    def run(self, report: CommandReport) -> int:
        """Keep the report's text for `output()`; its exit code."""
        self.text += report.text
        return report.exit_code

    def output(self) -> str:
        text, self.text = self.text, ""
        return text

    def project(self, text: str, *, trust: bool = False) -> Path:
        path = self.repo / ".warren/policy.toml"
        path.write_text(text, encoding="utf-8")
        if trust:
            self.store.trust(self.repo)
        return path


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return Setup(tmp_path)


PROJECT = """\
[permissions]
allow = ["Bash(make check)", "Edit(src/**)"]
deny = ["Bash(curl:*)"]

[[examples]]
tool = "Bash"
command = "make check"
decision = "allow"

[[examples]]
tool = "Bash"
command = "curl x | sh"
decision = "deny"

[[examples]]
tool = "Edit"
path = "src/a.py"
decision = "allow"

[[examples]]
tool = "Bash"
command = "rg foo"
decision = "ask"
floor = false

[[examples]]
tool = "Bash"
command = "rg foo"
decision = "allow"
floor = true
"""


# -- check --


def test_check_target() -> None:
    assert check_target(["rm", "-rf", "build"], after_dashdash=True) == "rm -rf build"
    assert check_target(["ls | wc -l"], after_dashdash=True) == "ls | wc -l"
    assert check_target(["Edit", "src/a.py"], after_dashdash=False) == ("Edit", "src/a.py")
    with pytest.raises(PolicyError):
        check_target([], after_dashdash=True)
    with pytest.raises(PolicyError):
        check_target(["Edit"], after_dashdash=False)


def test_a_path_rule_for_a_tool_without_a_path_is_a_policy_error(setup: Setup) -> None:
    """`Think(x)` parses (any keyword may take a path), but Think declares no path field: the
    rule would match nothing, so the policy is refused with its file (exit 2)."""
    setup.project('[permissions]\ndeny = ["Think(x)"]\n')
    code = setup.run(
        commands.check("ls", cwd=setup.repo, floor_proven=True, environment=setup.environment())
    )
    assert code == 2
    assert "Think takes no path" in setup.output()


def test_check_of_a_tool_without_a_path_is_a_policy_error(setup: Setup) -> None:
    """Which tools take a path is their declared facts: Bash and Think take none."""
    for tool in ("Bash", "Think"):
        code = setup.run(
            commands.check((tool, "ls"), cwd=setup.repo, environment=setup.environment())
        )
        assert code == 2
        assert "takes no path" in setup.output()


def test_check_json_has_exactly_the_documented_keys(setup: Setup) -> None:
    setup.project(PROJECT, trust=True)
    code = setup.run(
        commands.check(
            "make check",
            json_output=True,
            cwd=setup.repo,
            floor_proven=True,
            environment=setup.environment(),
        )
    )
    assert code == 0
    data = json.loads(setup.output())
    assert data == {
        "decision": "allow",
        "read_only": False,
        "concurrency_safe": False,
        "rule": "Bash(make check)",
        "source": str(setup.repo / ".warren/policy.toml"),
        "mode": "default",
        "floor": "proven",
    }
    assert setup.probes == 0  # the floor was given


def test_check_text_for_a_path_tool(setup: Setup) -> None:
    setup.project(PROJECT)  # not trusted: the Edit allow waits
    code = setup.run(
        commands.check(
            ("Edit", "src/a.py"),
            cwd=setup.repo,
            floor_proven=False,
            environment=setup.environment(),
        )
    )
    assert code == 0
    lines = dict(line.split(":", 1) for line in setup.output().splitlines())
    assert lines["decision"].strip() == "ask"
    assert lines["floor"].strip() == "unproven"
    assert lines["mode"].strip() == "default"
    assert lines["rule"].strip() == "-"
    assert lines["source"].strip() == "built-in"


def test_check_read_only_command_with_the_probed_floor(setup: Setup) -> None:
    setup.run(
        commands.check(
            "rg -n TODO | head",
            json_output=True,
            cwd=setup.repo,
            environment=setup.environment(),
        )
    )
    data = json.loads(setup.output())
    assert setup.probes == 1
    assert (data["decision"], data["read_only"], data["concurrency_safe"]) == ("allow", True, True)
    assert (data["rule"], data["source"], data["floor"]) == ("read-only", "built-in", "proven")


def test_check_uses_the_command_line_level(setup: Setup) -> None:
    environment = setup.environment(command_line=command_line_policy(disallowed_tools=["Bash"]))
    setup.run(
        commands.check(
            "ls", json_output=True, cwd=setup.repo, floor_proven=True, environment=environment
        )
    )
    data = json.loads(setup.output())
    assert (data["decision"], data["source"]) == ("deny", "command line")


def test_check_reports_a_broken_policy_with_its_location(setup: Setup) -> None:
    path = setup.project('[permissions]\nallow = ["Bash("]\n')
    code = setup.run(
        commands.check("ls", cwd=setup.repo, floor_proven=True, environment=setup.environment())
    )
    assert code == 2
    assert setup.output().startswith(f"error: {path}:2: permissions.allow[0]: ")


def test_check_reports_bypass_without_the_floor(setup: Setup) -> None:
    path = setup.project('mode = "bypass"\n', trust=True)
    code = setup.run(
        commands.check("ls", cwd=setup.repo, floor_proven=False, environment=setup.environment())
    )
    assert code == 2
    assert f"{path}: mode: bypass mode" in setup.output()


# -- show --


def test_show_lists_rules_with_their_sources_and_trust(setup: Setup) -> None:
    path = setup.project(PROJECT)
    user = setup.root / "config/warren/policy.toml"
    user.parent.mkdir(parents=True)
    user.write_text('mode = "plan"\n[permissions]\nask = ["Bash(git push:*)"]\n')
    assert setup.run(commands.show(setup.repo, environment=setup.environment())) == 0
    text = setup.output()
    assert "NOT trusted" in text
    assert f"mode: plan  ({user})" in text
    assert "deny  Bash(curl:*)" in text and str(path) in text
    assert "(ignored: project not trusted)" in text
    assert "max_turns = 100  (built-in)" in text
    assert "examples: 5" in text
    setup.store.trust(setup.repo)
    setup.run(commands.show(setup.repo, environment=setup.environment()))
    text = setup.output()
    assert "project:   trusted" in text and "ignored" not in text


# -- test --


def test_examples_pass_when_trusted(setup: Setup) -> None:
    setup.project(PROJECT, trust=True)
    assert (
        setup.run(commands.test(setup.repo, floor_proven=True, environment=setup.environment()))
        == 0
    )
    text = setup.output()
    assert text.count("ok    ") == 5 and "5 of 5 examples passed" in text


def test_a_mismatch_fails_and_says_why(setup: Setup) -> None:
    setup.project(PROJECT)  # untrusted: the two allow examples fail
    assert (
        setup.run(commands.test(setup.repo, floor_proven=True, environment=setup.environment()))
        == 1
    )
    text = setup.output()
    assert "FAIL  Bash(make check) -> allow" in text
    assert "FAIL  Edit(src/a.py) -> allow" in text
    assert "got ask" in text
    assert "NOT trusted" in text
    assert "3 of 5 examples passed" in text


def test_examples_without_a_floor_use_the_probe_once(setup: Setup) -> None:
    setup.project(
        '[[examples]]\ntool = "Read"\npath = "a.py"\ndecision = "allow"\n'
        '[[examples]]\ntool = "Think"\ninput = { thought = "x" }\ndecision = "allow"\n'
    )
    assert setup.run(commands.test(setup.repo, environment=setup.environment())) == 0
    assert setup.probes == 1


def test_no_examples(setup: Setup) -> None:
    assert (
        setup.run(commands.test(setup.repo, floor_proven=True, environment=setup.environment()))
        == 0
    )
    assert "no examples" in setup.output()


# -- init --


def test_init_detects_commands_and_refuses_to_overwrite(setup: Setup) -> None:
    repo = setup.repo
    (repo / ".warren").rmdir()
    (repo / "Makefile").write_text("check: lint\n\tpytest\nlint:\n\truff .\nbuild := out\n")
    (repo / "package.json").write_text(json.dumps({"scripts": {"test": "jest", "build": "tsc"}}))
    (repo / "pyproject.toml").write_text("[tool.pytest.ini_options]\n[tool.ruff]\n")
    (repo / "uv.lock").write_text("")
    (repo / "Cargo.toml").write_text("[package]\n")
    (repo / "go.mod").write_text("module x\n")
    assert setup.run(commands.init(repo, environment=setup.environment())) == 0
    target = repo / ".warren/policy.toml"
    policy = load_policy_file(target)
    assert policy is not None
    allow = policy.permissions.allow
    for rule in [
        "Bash(make check)",
        "Bash(make lint)",
        "Bash(npm run test:*)",
        "Bash(npm run build:*)",
        "Bash(npm test:*)",
        "Bash(uv run pytest:*)",
        "Bash(uv run ruff check:*)",
        "Bash(cargo test:*)",
        "Bash(go test:*)",
    ]:
        assert rule in allow, rule
    assert "Bash(make build)" not in allow  # a variable, not a target
    assert (repo / ".warren/.gitignore").read_text() == "policy.local.toml\n"
    text = target.read_text()
    assert text.startswith("# Warren policy")
    setup.output()
    assert setup.run(commands.init(repo, environment=setup.environment())) == 1
    assert "exists" in setup.output()
    assert target.read_text() == text
    # The starter's own examples hold once the repository is trusted.
    setup.store.trust(repo)
    assert setup.run(commands.test(repo, floor_proven=True, environment=setup.environment())) == 0


def test_init_in_an_empty_repository_writes_a_valid_file(setup: Setup) -> None:
    assert setup.run(commands.init(setup.repo, environment=setup.environment())) == 0
    policy = load_policy_file(setup.repo / ".warren/policy.toml")
    assert policy is not None and policy.permissions.allow == ()


def test_init_detects_pnpm_and_tox(setup: Setup) -> None:
    (setup.repo / "package.json").write_text('{"scripts": {"lint": "eslint"}}')
    (setup.repo / "pnpm-lock.yaml").write_text("")
    (setup.repo / "pyproject.toml").write_text("[tool.tox]\n")
    rules = [rule for rule, _ in commands.detect_project_commands(setup.repo)]
    assert rules == ["Bash(pnpm run lint:*)", "Bash(tox:*)"]


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory outside the repository and outside /tmp, removed after."""
    path = Path(tempfile.mkdtemp(prefix="warren-init-outside-", dir="/var/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.mark.parametrize("plant", ["warren-dir", "gitignore-link", "dangling-gitignore"])
def test_init_never_writes_through_a_planted_link(setup: Setup, outside: Path, plant: str) -> None:
    repo = setup.repo
    (outside / ".bashrc").write_text("# mine\n")
    if plant == "warren-dir":
        (repo / ".warren").rmdir()
        (repo / ".warren").symlink_to(outside)
        assert setup.run(commands.init(repo, environment=setup.environment())) == 1
        assert "symbolic link" in setup.output()
    else:
        target = outside / (".bashrc" if plant == "gitignore-link" else "created-by-warren")
        (repo / ".warren/.gitignore").symlink_to(target)
        assert setup.run(commands.init(repo, environment=setup.environment())) == 0
        assert not (outside / "created-by-warren").exists()
    assert sorted(p.name for p in outside.iterdir()) == [".bashrc"]
    assert (outside / ".bashrc").read_text() == "# mine\n"


@pytest.mark.parametrize("kind", ["fifo", "secret-link", "dev-zero"])
def test_init_reads_build_files_only_when_regular(setup: Setup, outside: Path, kind: str) -> None:
    """A Makefile that is a FIFO, a link to a host file or to /dev/zero is skipped at once."""
    makefile = setup.repo / "Makefile"
    if kind == "fifo":
        os.mkfifo(makefile)
    elif kind == "secret-link":
        (outside / "Makefile").write_text("check:\n\ttrue\n")
        makefile.symlink_to(outside / "Makefile")
    else:
        makefile.symlink_to("/dev/zero")
    rules = [rule for rule, _ in commands.detect_project_commands(setup.repo)]
    assert "Bash(make check)" not in rules


# -- trust --


def test_trust_and_untrust_commands(setup: Setup) -> None:
    setup.project(PROJECT)
    assert setup.run(commands.trust_cmd(setup.repo, environment=setup.environment())) == 0
    text = setup.output()
    assert "trusted" in text and "now allowed: Bash(make check)" in text
    assert setup.store.is_trusted(setup.repo, project_policy_hash(setup.repo))
    assert setup.run(commands.untrust_cmd(setup.repo, environment=setup.environment())) == 0
    assert "untrusted" in setup.output()
    assert not setup.store.is_trusted(setup.repo, project_policy_hash(setup.repo))
    assert setup.run(commands.untrust_cmd(setup.repo, environment=setup.environment())) == 0
    assert "was not trusted" in setup.output()


def test_a_broken_policy_is_not_trusted(setup: Setup) -> None:
    setup.project("mode = \n")
    assert setup.run(commands.trust_cmd(setup.repo, environment=setup.environment())) == 2
    assert setup.store.record(setup.repo) is None


def test_nothing_to_trust(setup: Setup) -> None:
    assert setup.run(commands.trust_cmd(setup.repo, environment=setup.environment())) == 0
    assert "nothing to trust" in setup.output()
