"""Warm tool hosts: the server's spare sandboxes (`SpareKeeper`) and a session's link to them
(`SpareLink`). The same goes for the sandbox of a session's context probe
(`orchestrator.conversation.context`), which waits in its spare for the probe's code.

A session that started its tool hosts cold reports the recipe of each (`sandbox.spare.
SpareRecipe`: spec, host facts, command, as gathered by the session); when that session has
ended (its own hosts are no longer starting), the server starts one spare from each recipe
it has not got a spare of. The next
session on the workspace gathers its own recipe, and adopts a spare only if the keys are
equal (a changed deny rule, a new secret file, another environment or tool list: cold, as
without a server). A spare serves exactly one session: it is handed out once, the server
closes its ends of the pipes at once and starts a fresh replacement from the same recipe
(`REPLACE_AFTER_S` later, or when that session ends), so no shell, environment or process of
one session reaches the next.

The server reads no policy and nothing in a workspace: it only starts what a session reported
(`sandbox.spare.spawn_spare`: the same argv builder, cgroup and seccomp filter, no environment
of its own). It is every spare's parent (it reaps them and removes their cgroups); the
adopting session gets a pidfd to signal and wait on, and the pipes.

Each session process has its own link to the server: one end of a socketpair made before the
fork, so the server knows which session asks, and claims are atomic (the server is one
thread and marks a spare taken before it answers). The forked session closes the
descriptors of every spare and every other session's link at once (`SpareKeeper.
inherited_fds`); it holds only what it claims.

Bounds: spares of the last `MAX_WORKSPACES` workspaces, `MAX_SPARES` in all; a spare
unclaimed for `SPARE_IDLE_S` is stopped; all are stopped when the server stops. A spare
handed out outlives the server's stop as long as its session runs: the server gives up its
socket and lock at once (a new server may start) and waits for those to be reaped, since
bwrap's `--die-with-parent` would kill them with it. A server that dies takes them along:
the session's next call starts a fresh host, as after any host crash.

A read-write tool host's recipe also starts a template (orchestrator/cli/warm/host_template.py):
one warmed interpreter under that host's floor that forks the workspace's spare tool hosts,
read-write and read-only, so they share its pages instead of each being an interpreter of
its own. A read-only recipe is forked from the template of the read-write recipe it is the
read-only form of (`SpareRecipe.as_read_only`); anything else (another recipe, a template not
ready yet or gone, no user namespaces in the sandbox) starts a fresh spare as before. A
template retired (its workspace evicted, its recipe superseded, unused for `idle_s`, the
server stopping) forks no more and leaves once its handed-out hosts have.

What is not in the key: the trust state and the policy as such. Only what they make of the
host counts (the masks, protected paths, `--read-deny`, tools factory, environment are all in
the recipe); allow rules and hooks are decisions the coordinator makes, not the host.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.cli.client import ServerLink

if TYPE_CHECKING:
    from orchestrator.cli.warm.host_template import HostTemplate
    from sandbox.spare import Adopted, ForkedSpare, SpareChild, SpareRecipe

__all__ = [
    "MAX_SPARES",
    "MAX_WORKSPACES",
    "REPLACE_AFTER_S",
    "SPARE_IDLE_S",
    "SpareKeeper",
    "SpareLink",
]

MAX_WORKSPACES = 4
"""Workspaces the server keeps spares for (the most recently used)."""

SPARE_IDLE_S = 900.0
"""Seconds an unclaimed spare lives: 15 minutes."""

MAX_SPARES = 3 * MAX_WORKSPACES
"""Spares kept at once: a workspace's two tool hosts and its context probe's sandbox
(`orchestrator.conversation.context`); a workspace's sessions in several directories each have
their own; the oldest goes first."""

REPLACE_AFTER_S = 3.0
"""Seconds after a claim that the spare's replacement starts, unless the session that
claimed it ends first: its start-up (half a second of CPU) would otherwise compete with that
session's first tool calls; a session coming sooner than that starts cold or finds it
starting."""

_LINK_TIMEOUT_S = 5.0
"""Seconds either side waits on a link message before giving up (a wedged peer)."""


@dataclass(eq=False)
class _Spare:
    key: str
    recipe: SpareRecipe
    child: SpareChild | ForkedSpare
    started: float = field(default_factory=time.monotonic)


class SpareKeeper:
    """The server's side: spares by recipe key, the links of running sessions, the recipes
    each session reported. Used from the server's one thread only."""

    def __init__(
        self,
        *,
        max_workspaces: int = MAX_WORKSPACES,
        max_spares: int = MAX_SPARES,
        idle_s: float = SPARE_IDLE_S,
    ) -> None:
        """`max_workspaces`, `max_spares`, `idle_s`: the bounds (`MAX_WORKSPACES`,
        `MAX_SPARES`, `SPARE_IDLE_S`)."""
        self._max_workspaces = max_workspaces
        self._max_spares = max_spares
        self._idle_s = idle_s
        self._idle: dict[str, _Spare] = {}
        self._handed: list[SpareChild | ForkedSpare] = []
        self._templates: dict[str, HostTemplate] = {}
        """Live templates by the key of the read-write recipe they were started from."""
        self._retired: list[HostTemplate] = []
        """Templates that fork no more, until they are reaped."""
        self._links: dict[int, ServerLink] = {}
        self._reported: dict[int, dict[tuple[str, ...], SpareRecipe]] = {}
        """Per session, the last recipe it used for each slot (`SpareRecipe.slot`: a host
        restarted with new masks replaces its first recipe)."""
        self._recent: OrderedDict[Path, None] = OrderedDict()
        self._replacing: dict[int, list[tuple[float, str, SpareRecipe]]] = {}
        """Per session, the spares it claimed, to replace at its end or when due."""
        self.handed_out = 0
        """Spares handed to sessions so far (`warren server status`)."""

    # -- links -------------------------------------------------------------------------------

    def new_link(self) -> tuple[socket.socket, socket.socket]:
        """The server's end and the session's end of a new session's link (made before the
        fork; `attach` the server's end to the session's pid after it)."""
        ours, theirs = socket.socketpair()
        ours.settimeout(_LINK_TIMEOUT_S)
        return ours, theirs

    def attach(self, pid: int, link: socket.socket) -> None:
        self._links[pid] = ServerLink(link)

    def link_fds(self) -> dict[int, int]:
        """Descriptor -> session pid, for the server's select."""
        return {link.sock.fileno(): pid for pid, link in self._links.items()}

    def template_fds(self) -> list[int]:
        """The templates' descriptors, for the server's select (`template_readable`)."""
        return [fd for template in self._all_templates() for fd in template.fds()]

    def template_readable(self, fd: int) -> None:
        """A template said something (or left): one just ready replaces the fresh spares
        that stood in for it with forked ones; one gone is retired (the fresh ones stay)."""
        for template in self._all_templates():
            if fd not in template.fds():
                continue
            became_ready = template.readable()
            waiting, template.pending = template.pending, {}
            if template.dead:
                if self._templates.get(template.key) is template:
                    self._retire(template.key)  # reaped with the retired ones
            elif became_ready:
                # The fresh spares started meanwhile give way to forked ones.
                for key, recipe in sorted(waiting.items(), key=lambda kv: _read_only_last(kv[1])):
                    spare = self._idle.get(key)
                    if spare is not None and not spare.child.forked:
                        self._stop(key)
                        self._start(key, recipe)
            else:
                template.pending = waiting
            return

    def inherited_fds(self) -> list[int]:
        """What a process forked from the server must close first: every spare's descriptors
        and every session's link, the templates' and the pidfds kept of forked hosts."""
        fds = [fd for spare in self._idle.values() for fd in spare.child.descriptors()]
        fds += [fd for template in self._all_templates() for fd in template.inherited_fds()]
        children = [spare.child for spare in self._idle.values()] + self._handed
        fds += [fd for child in children for fd in child.kept_fds()]
        return fds + [link.sock.fileno() for link in self._links.values()]

    def _all_templates(self) -> list[HostTemplate]:
        return [*self._templates.values(), *self._retired]

    def serve(self, pid: int) -> None:
        """Answer the messages on the link of session `pid` (its end closed: detach it)."""
        link = self._links.get(pid)
        while link is not None:
            try:
                message, _ = link.receive()
            except (OSError, ValueError):
                message = None
            if message is None:
                self._detach(pid)
                return
            op = message.get("op")
            with contextlib.suppress(OSError):
                if op == "claim":
                    self._claim(pid, link, str(message.get("key")))
                elif op == "report":
                    self._report(pid, message.get("recipe"))
            if not link.buffered():
                return

    def _claim(self, pid: int, link: ServerLink, key: str) -> None:
        spare = self._idle.pop(key, None)
        if spare is None or spare.child.reaped():
            link.send({"spare": None})
            return
        child = spare.child
        cgroup = child.cgroup
        link.send(
            {
                "key": key,
                "spare": child.pid,
                "cgroup": [str(d) for d in cgroup.directories] if cgroup else [],
                "cgroup_version": cgroup.version if cgroup else None,
                "forked": child.forked,
            },
            fds=child.descriptors(),
        )
        child.close_descriptors()  # the session's alone now
        child.handed = True
        self._handed.append(child)
        self.handed_out += 1
        # Replaced shortly (`REPLACE_AFTER_S`), or when this session ends: the next session
        # may come before this one ends.
        due = time.monotonic() + REPLACE_AFTER_S
        self._replacing.setdefault(pid, []).append((due, key, spare.recipe))

    def _report(self, pid: int, data: Any) -> None:
        from sandbox.spare import SpareRecipe

        try:
            recipe = SpareRecipe.model_validate(data)
        except ValueError:
            return
        self._reported.setdefault(pid, {})[recipe.slot] = recipe

    def _detach(self, pid: int) -> None:
        link = self._links.pop(pid, None)
        if link is not None:
            link.close()

    # -- spares ------------------------------------------------------------------------------

    def session_ended(self, pid: int) -> None:
        """Session `pid` was reaped: its link goes, and a spare starts for each recipe it
        used that has none."""
        self._detach(pid)
        for _, key, recipe in self._replacing.pop(pid, []):
            self._start(key, recipe)
        recipes = {recipe.key(): recipe for recipe in self._reported.pop(pid, {}).values()}
        slots = {recipe.slot for recipe in recipes.values()}
        for key, spare in list(self._idle.items()):
            # A spare of a slot this session used, with another recipe, is out of date (the
            # session started cold: a deny rule, a mask, its environment changed).
            if spare.recipe.slot in slots and key not in recipes:
                self._stop(key)
        for key, template in list(self._templates.items()):
            if template.recipe.slot in slots and key not in recipes:
                self._retire(key)
        # A read-write recipe first: its template forks the read-only host too.
        for key, recipe in sorted(recipes.items(), key=lambda kv: _read_only_last(kv[1])):
            self._start(key, recipe)

    def _start(self, key: str, recipe: SpareRecipe) -> None:
        """A spare from `recipe`, unless one is idle already (the oldest goes when there are
        `max_spares`); a spare that cannot start is left out (sessions start cold)."""
        from sandbox.spare import spawn_spare

        if key in self._idle:
            return
        self._touch(recipe.workspace)
        while len(self._idle) >= self._max_spares:
            self._stop(min(self._idle, key=lambda k: self._idle[k].started))
        template, read_only = self._template_for(key, recipe)
        child: SpareChild | ForkedSpare | None = None
        if template is not None and not template.ready:
            # A fresh spare meanwhile (a session may come before the template has warmed),
            # replaced by a forked one once it is ready (`template_readable`).
            template.pending[key] = recipe
        elif template is not None:
            with contextlib.suppress(OSError):
                child = template.fork(recipe, read_only=read_only)
        if child is None:
            try:
                child = spawn_spare(recipe)
            except (OSError, ValueError):
                return
        self._idle[key] = _Spare(key, recipe, child)

    def _template_for(self, key: str, recipe: SpareRecipe) -> tuple[HostTemplate | None, bool]:
        """The template that forks `recipe`'s spare (started now for a read-write tool
        host's recipe), and whether it forks it read-only; None: a fresh spare."""
        from orchestrator.cli.warm.host_template import HostTemplate

        if recipe.is_read_write_host:
            template = self._templates.get(key)
            if template is not None and template.dead:
                self._retire(key)
                template = None
            if template is None:
                try:
                    template = HostTemplate(key, recipe)
                except (OSError, ValueError):
                    return None, False
                self._templates[key] = template
            return template, False
        for template in self._templates.values():
            if template.read_only_key == key and not template.dead:
                return template, True
        return None, False

    def _retire(self, key: str) -> None:
        template = self._templates.pop(key)
        template.retire()
        self._retired.append(template)

    def _touch(self, workspace: Path) -> None:
        self._recent[workspace] = None
        self._recent.move_to_end(workspace)
        while len(self._recent) > self._max_workspaces:
            old, _ = self._recent.popitem(last=False)
            for key, spare in list(self._idle.items()):
                if spare.recipe.workspace == old:
                    self._stop(key)
            for key, template in list(self._templates.items()):
                if template.recipe.workspace == old:
                    self._retire(key)

    def _stop(self, key: str) -> None:
        spare = self._idle.pop(key)
        spare.child.close_descriptors()  # end of input: the host exits by itself
        spare.child.kill()
        self._handed.append(spare.child)  # reaped with the others

    def wake_in(self) -> float:
        """Seconds until a replacement is due (the server's select waits no longer)."""
        dues = [due for waiting in self._replacing.values() for due, _, _ in waiting]
        return max(0.0, min(dues) - time.monotonic()) if dues else 60.0

    def reap(self) -> None:
        """Reap spares that exited (idle or handed out), stop those idle too long, start
        the replacements that are due."""
        now = time.monotonic()
        for pid, waiting in list(self._replacing.items()):
            self._replacing[pid] = [entry for entry in waiting if entry[0] > now]
            for due, key, recipe in waiting:
                if due <= now:
                    self._start(key, recipe)
        for key, spare in list(self._idle.items()):
            if spare.child.reaped():
                del self._idle[key]
            elif now - spare.started >= self._idle_s:
                self._stop(key)
        self._handed = [child for child in self._handed if not child.reaped()]
        for key, template in list(self._templates.items()):
            if template.reaped():
                del self._templates[key]
            elif now - template.used >= self._idle_s:
                self._retire(key)
        self._retired = [template for template in self._retired if not template.reaped()]

    def stop(self) -> None:
        """The server is leaving: stop the idle spares, close every link, and wait for the
        spares handed out (their sessions stop them; bwrap would die with us)."""
        for key in list(self._idle):
            self._stop(key)
        for key in list(self._templates):
            self._retire(key)
        for pid in list(self._links):
            self._detach(pid)
        while self._handed or self._retired:
            self._handed = [child for child in self._handed if not child.reaped()]
            self._retired = [template for template in self._retired if not template.reaped()]
            waiting = [*self._handed, *self._retired]
            if waiting:
                with contextlib.suppress(ChildProcessError, OSError):
                    waiting[0].wait(1.0)

    def status(self) -> dict[str, Any]:
        return {
            "spares": len(self._idle),
            "spare_pids": sorted(s.child.pid for s in self._idle.values()),
            "spares_handed_out": self.handed_out,
            "templates": len(self._templates),
            "template_pids": sorted(t.child.pid for t in self._templates.values()),
            "warm_workspaces": [str(w) for w in self._recent],
        }


def _read_only_last(recipe: SpareRecipe) -> bool:
    """Sort key: a read-write tool host's recipe before the rest (its template comes first)."""
    return not recipe.is_read_write_host


class SpareLink:
    """A session's end of its link (`sandbox.spare.SpareSource`): claims and reports, one
    at a time (the two tool hosts start concurrently)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.settimeout(_LINK_TIMEOUT_S)
        self._link = ServerLink(sock)
        self._lock = threading.Lock()
        self._broken = False
        """A claim failed half-way (a timeout): a late answer may still be in the socket,
        so the link is not used again (the rest of the session starts cold)."""

    async def claim(self, recipe: SpareRecipe) -> Adopted | None:
        """A spare of `recipe`'s key, now ours; None when the server has none (or is gone).

        **Cancellation:** not cancellable (a handed spare must not be lost on the way); the
        server answers at once or not at all within a few seconds."""
        import trio

        key = recipe.key()
        return await trio.to_thread.run_sync(self._claim, key)

    def _claim(self, key: str) -> Adopted | None:
        from sandbox.spare import Adopted

        with self._lock:
            if self._broken:
                return None
            fds: list[int] = []
            try:
                self._link.send({"op": "claim", "key": key})
                message, fds = self._link.receive(max_fds=4)
            except (OSError, ValueError):
                message = None
            if message is None or (message.get("spare") and message.get("key") != key):
                self._broken = True
        if message is None or not message.get("spare") or len(fds) != 4 or self._broken:
            for fd in fds:
                os.close(fd)
            return None
        pidfd, stdin, stdout, stderr = fds
        version = message.get("cgroup_version")
        return Adopted(
            forked=message.get("forked") is True,
            pid=int(message["spare"]),
            pidfd=pidfd,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            cgroup=tuple(Path(d) for d in message.get("cgroup") or ()),
            cgroup_version=version if isinstance(version, int) else None,
        )

    def close(self) -> None:
        """End the link (the server detaches this session's end)."""
        with self._lock:
            self._broken = True
            self._link.close()

    def report(self, recipe: SpareRecipe) -> None:
        with self._lock, contextlib.suppress(OSError):
            if not self._broken:
                self._link.send({"op": "report", "recipe": recipe.model_dump(mode="json")})
