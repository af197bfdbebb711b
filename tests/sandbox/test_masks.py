"""Host facts: which paths get masked, pinned, watched, on real scratch trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.errors import SandboxConfigError
from sandbox.masks import gather_host_facts
from sandbox.spec import Bind, ProtectedPath, SandboxSpec, WorkspaceRoot


def _spec(ws: Path, home: Path, **kwargs: object) -> SandboxSpec:
    # The secret masks are tested with the home visible; hiding it is tested on its own below.
    values: dict[str, object] = {
        "workspaces": (WorkspaceRoot(path=ws),),
        "home": home,
        "hide_home": False,
    }
    values.update(kwargs)
    return SandboxSpec.model_validate(values)


@pytest.fixture
def tree(scratch: Path) -> tuple[Path, Path]:
    ws, home = scratch / "ws", scratch / "home"
    ws.mkdir()
    home.mkdir()
    return ws, home


def test_existing_secrets_are_masked_at_their_resolved_target(
    tree: tuple[Path, Path], scratch: Path
) -> None:
    ws, home = tree
    (home / ".ssh").mkdir()
    real = scratch / "vault" / "netrc"
    real.parent.mkdir()
    real.write_text("x")
    (home / ".netrc").symlink_to(real)
    (home / ".aws").symlink_to(scratch / "nowhere")  # dangling: nothing to read
    facts = gather_host_facts(_spec(ws, home), environ={})
    assert home / ".ssh" in facts.deny_dirs
    assert real in facts.deny_files
    assert home / ".netrc" not in facts.deny_files
    assert all("aws" not in str(p) and "nowhere" not in str(p) for p in facts.deny_dirs)
    assert all(not p.is_relative_to(home) for p in facts.watched)


def test_xdg_dirs_and_home_defaults_are_both_masked(tree: tuple[Path, Path], scratch: Path) -> None:
    ws, home = tree
    xdg = scratch / "xdg"
    (xdg / "warren").mkdir(parents=True)
    (home / ".config" / "warren").mkdir(parents=True)
    (home / ".local" / "state" / "warren").mkdir(parents=True)
    facts = gather_host_facts(_spec(ws, home), environ={"XDG_CONFIG_HOME": str(xdg)})
    assert {
        xdg / "warren",
        home / ".config" / "warren",
        home / ".local" / "state" / "warren",
    } <= set(facts.deny_dirs)


def test_glob_patterns_match_existing_files_only(tree: tuple[Path, Path], scratch: Path) -> None:
    ws, home = tree
    keys = scratch / "etc-ssh"
    keys.mkdir()
    for name in ("ssh_host_ed25519_key", "ssh_host_ed25519_key.pub", "sshd_config"):
        (keys / name).write_text("x")
    facts = gather_host_facts(_spec(ws, home, extra_deny_read=(f"{keys}/*_key",)), environ={})
    assert [p for p in facts.deny_files if p.parent == keys] == [keys / "ssh_host_ed25519_key"]


def test_secret_in_private_tmp_needs_no_mask(tree: tuple[Path, Path], tmp_path: Path) -> None:
    ws, home = tree
    secret = tmp_path / "secret"
    secret.write_text("x")
    facts = gather_host_facts(_spec(ws, home, extra_deny_read=(str(secret),)), environ={})
    assert secret not in facts.deny_files


def test_workspace_inside_a_secret_is_refused(tree: tuple[Path, Path]) -> None:
    _, home = tree
    inside = home / ".ssh" / "project"
    inside.mkdir(parents=True)
    with pytest.raises(SandboxConfigError) as info:
        gather_host_facts(_spec(inside, home), environ={})
    assert "workspaces[0]" in info.value.fields


def test_missing_workspace_is_refused(scratch: Path) -> None:
    with pytest.raises(SandboxConfigError, match="does not exist"):
        gather_host_facts(_spec(scratch / "nope", scratch), environ={})


def test_executable_inside_writable_workspace_is_refused(tree: tuple[Path, Path]) -> None:
    ws, home = tree
    exe = ws / ".venv" / "bwrap"
    exe.parent.mkdir()
    exe.write_text("")
    with pytest.raises(SandboxConfigError, match="could replace it"):
        gather_host_facts(_spec(ws, home), environ={}, executables=[exe])
    ro = _spec(ws, home).read_only()
    gather_host_facts(ro, environ={}, executables=[exe])  # read-only: fine


def test_existing_protected_paths_are_bound_read_only_and_their_parents_pinned(
    tree: tuple[Path, Path],
) -> None:
    ws, home = tree
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "config").write_text("")
    (ws / ".envrc").write_text("")
    facts = gather_host_facts(_spec(ws, home), environ={})
    assert {ws / ".git" / "hooks", ws / ".git" / "config", ws / ".envrc"} <= set(facts.protected)
    assert ws / ".git" in facts.pins
    assert ws not in facts.pins


def test_missing_protected_paths_are_watched_not_created(tree: tuple[Path, Path]) -> None:
    ws, home = tree
    facts = gather_host_facts(_spec(ws, home), environ={})
    watched = set(facts.watched)
    assert {ws / ".git" / "hooks", ws / ".envrc", ws / ".github" / "workflows"} <= watched
    assert not watched & set(facts.protected)  # nothing to mount onto
    assert sorted(ws.iterdir()) == []  # and nothing was created in the user's tree


def test_missing_names_inside_git_are_watched(tree: tuple[Path, Path]) -> None:
    ws, home = tree
    (ws / ".git" / "hooks").mkdir(parents=True)
    facts = gather_host_facts(_spec(ws, home), environ={})
    assert {ws / ".git" / "commondir", ws / ".git" / "config"} <= set(facts.watched)
    assert ws / ".git" / "hooks" in facts.protected
    assert sorted(p.name for p in (ws / ".git").iterdir()) == ["hooks"]


def test_read_only_workspace_needs_no_protection(tree: tuple[Path, Path]) -> None:
    ws, home = tree
    facts = gather_host_facts(_spec(ws, home).read_only(), environ={})
    assert facts.protected == () and facts.watched == () and facts.pins == ()


def test_worktree_pointer_and_real_gitdirs_are_protected(scratch: Path) -> None:
    main_git = scratch / "main" / ".git"
    gitdir = main_git / "worktrees" / "wt"
    (main_git / "hooks").mkdir(parents=True)
    (main_git / "config").write_text("")
    gitdir.mkdir(parents=True)
    (gitdir / "commondir").write_text("../..\n")
    wt = scratch / "wt"
    wt.mkdir()
    (wt / ".git").write_text(f"gitdir: {gitdir}\n")
    spec = SandboxSpec(
        workspaces=(WorkspaceRoot(path=wt),),
        extra_binds=(Bind(path=main_git, mode="rw"),),
        home=scratch,
    )
    facts = gather_host_facts(spec, environ={})
    assert wt / ".git" in facts.protected
    assert {main_git / "hooks", main_git / "config", gitdir / "commondir"} <= set(facts.protected)
    assert gitdir not in facts.protected  # the worktree's index and HEAD stay writable


def test_protected_symlink_protects_the_target_and_warns(tree: tuple[Path, Path]) -> None:
    ws, home = tree
    (ws / "envrc.real").write_text("")
    (ws / ".envrc").symlink_to("envrc.real")
    facts = gather_host_facts(_spec(ws, home), environ={})
    assert ws / "envrc.real" in facts.protected
    assert any("symlink" in w for w in facts.warnings)


def test_extra_protected_accepts_plain_strings_and_absolute_paths(
    tree: tuple[Path, Path],
) -> None:
    ws, home = tree
    (ws / "Makefile").write_text("")
    spec = _spec(ws, home, extra_protected=["Makefile", str(ws / "abs.cfg")])
    assert spec.extra_protected[0] == ProtectedPath(path="Makefile")
    facts = gather_host_facts(spec, environ={})
    assert ws / "Makefile" in facts.protected
    assert ws / "abs.cfg" in facts.watched


def test_missing_secret_in_a_writable_home_is_watched(tree: tuple[Path, Path]) -> None:
    _, home = tree
    facts = gather_host_facts(_spec(home, home), environ={})
    assert home / ".ssh" in facts.watched


def test_nothing_inside_a_protected_directory_is_listed_twice(tree: tuple[Path, Path]) -> None:
    ws, home = tree
    (ws / ".git" / "modules" / "sub" / "hooks").mkdir(parents=True)
    spec = _spec(ws, home, extra_protected=[".git/modules/sub/hooks"])
    facts = gather_host_facts(spec, environ={})
    assert ws / ".git" / "modules" in facts.protected
    assert not any(p.is_relative_to(ws / ".git" / "modules" / "sub") for p in facts.protected)
    assert not any(p.is_relative_to(ws / ".git" / "modules") for p in facts.pins)


def test_bind_contradiction_after_resolution(scratch: Path) -> None:
    real = scratch / "real"
    real.mkdir()
    (scratch / "link").symlink_to(real)
    spec = SandboxSpec(
        workspaces=(WorkspaceRoot(path=real, mode="rw"),),
        extra_binds=(Bind(path=scratch / "link", mode="ro"),),
        home=scratch,
    )
    with pytest.raises(SandboxConfigError) as info:
        gather_host_facts(spec, environ={})
    assert info.value.fields == ("workspaces[0]", "extra_binds[0]")


def test_a_root_shown_at_another_path_is_bound_read_only_there(
    tree: tuple[Path, Path], scratch: Path
) -> None:
    """A remote worker's snapshot view is shown at the coordinator's workspace path, which
    need not exist on the node (workers/remote/actor.py)."""
    from sandbox.argv import bwrap_argv

    view, home = tree
    inside = Path("/nowhere/on/this/host/repo")
    spec = _spec(view, home, workspaces=(WorkspaceRoot(path=inside, mode="ro", source=view),))
    facts = gather_host_facts(spec)
    [bind] = [b for b in facts.binds if b.label == "workspaces[0]"]
    assert (bind.path, bind.source, bind.mode) == (inside, view.resolve(), "ro")
    argv = bwrap_argv(spec, ["true"], bwrap=Path("/bin/bwrap"), facts=facts)
    at = argv.index(str(inside))
    assert argv[at - 2 : at + 1] == ["--ro-bind", str(view.resolve()), str(inside)]
    with pytest.raises(ValueError, match="mode 'ro'"):
        WorkspaceRoot(path=inside, mode="rw", source=view)
