"""Spike driver (host side): start the zygote under the floor, fork workers, measure, attack.

    .venv/bin/python spike/drive.py [N]
"""

from __future__ import annotations

import array
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandbox.argv import bwrap_argv  # noqa: E402
from sandbox.host import detect_host  # noqa: E402
from sandbox.masks import gather_host_facts, python_runtime_paths, warren_code_paths  # noqa: E402
from sandbox.seccomp import build_filter  # noqa: E402
from sandbox.spec import SandboxSpec, WorkspaceRoot  # noqa: E402


def zygote_command(workspace: Path, control_fd: int, seccomp_fd: int) -> list[str]:
    host = trio.run(detect_host)
    spec = SandboxSpec(workspaces=(WorkspaceRoot(path=workspace, mode="ro"),))
    values = {**spec.env.values, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(ROOT)}
    values["SPIKE_WEAK"] = os.environ.get("SPIKE_WEAK", "0")
    spec = spec.model_copy(update={"env": spec.env.model_copy(update={"values": values})})
    facts = gather_host_facts(
        spec,
        executables=[host.bwrap.path, host.prlimit],
        runtime=python_runtime_paths(),
        own_code=warren_code_paths(),
    )
    inner_uid = 0 if os.getuid() == 0 else os.getuid()
    argv = bwrap_argv(
        spec,
        [sys.executable, "-I", str(ROOT / "spike" / "zygote.py"), str(control_fd),
         str(inner_uid), str(inner_uid)],
        bwrap=host.bwrap.path,
        facts=facts,
        prlimit=host.prlimit,
        seccomp_fd=seccomp_fd,
    )
    argv.remove("--disable-userns")
    i = argv.index("--proc")
    del argv[i : i + 2]
    i = argv.index("/tmp")
    argv[i + 1 : i + 1] = ["--proc", "/tmp/.proc"]
    if os.getuid() == 0:
        # Root maps root: a nested namespace can map its creator's uid only when that is not
        # 0 (or with CAP_SETFCAP), so the zygote runs as 1000 (still host root outside).
        i = argv.index("--unshare-user")
        argv[i + 1 : i + 1] = ["--uid", "1000", "--gid", "1000"]
    return argv


class Zygote:
    def __init__(self, workspace: Path) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        program = build_filter(allow_unix_sockets=False)
        assert program is not None
        r, w = os.pipe()
        os.write(w, program)
        os.close(w)
        cmd = zygote_command(workspace, theirs.fileno(), r)
        self.proc = subprocess.Popen(cmd, pass_fds=(theirs.fileno(), r), stdin=subprocess.DEVNULL)
        os.close(r)
        theirs.close()
        self.ctl = ours
        hello = json.loads(self.ctl.recv(65536))
        assert "ready" in hello, hello
        self.exits: dict[int, int] = {}

    def fork(self, argv: list[str] | None = None, exec_: list[str] | None = None, attack=None):
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        req = {"argv": argv or [], "exec": exec_, "attack": attack}
        self.ctl.sendmsg([json.dumps(req).encode()],
                         [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [in_r, out_w, err_w]))])
        for fd in (in_r, out_w, err_w):
            os.close(fd)
        while True:
            fds = array.array("i")
            msg, anc, _, _ = self.ctl.recvmsg(65536, socket.CMSG_SPACE(4))
            reply = json.loads(msg)
            if "exit" in reply:
                self.exits[reply["exit"]] = reply["status"]
                continue
            for _, _, data in anc:
                fds.frombytes(data)
            pidfd = fds[0]
            host_pid = next(
                int(line.split()[1])
                for line in Path(f"/proc/self/fdinfo/{pidfd}").read_text().splitlines()
                if line.startswith("Pid:")
            )
            self.last_zpid = reply["pid"]
            return host_pid, pidfd, in_w, out_r, err_r

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def tree(pid: int) -> list[psutil.Process]:
    p = psutil.Process(pid)
    return [p, *p.children(recursive=True)]


def pss(procs: list[psutil.Process]) -> float:
    return sum(p.memory_full_info().pss for p in procs) / 1e6


def read_line(fd: int) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            break
        buf += chunk
    return buf


def attack_main() -> None:
    import select as sel

    ws = Path(tempfile.mkdtemp())
    z = Zygote(ws)
    try:
        victim = z.fork(argv=["--workspace", str(ws), "--role", "read_only"])
        assert b'"type":"ready"' in read_line(victim[3])
        victim_z = z.last_zpid
        tool = z.fork(exec_=["/bin/sleep", "1000"])
        tool_z = z.last_zpid
        time.sleep(0.3)
        zyg = [p.pid for p in tree(z.proc.pid)]
        targets = sorted({victim[0], victim_z, tool[0], tool_z, os.getpid(), *zyg, *range(1, 40)})
        attacker = z.fork(attack=targets)
        report = json.loads(read_line(attacker[3]))
        print(json.dumps(report))
        for name, w in (("victim worker", victim), ("sibling tool", tool)):
            alive = not sel.select([w[1]], [], [], 0)[0]
            print(name, "alive:", alive, "host pid", w[0])
        print("zygote tree alive:", [p.is_running() and p.status() != "zombie" for p in tree(z.proc.pid)])
        again = z.fork(argv=["--workspace", str(ws), "--role", "read_only"])
        print("zygote still forks:", b'"type":"ready"' in read_line(again[3]))
        os.write(victim[2], b'{"type":"shutdown"}\n')
    finally:
        z.close()


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    ws = Path(tempfile.mkdtemp())
    print("load", os.getloadavg())
    z = Zygote(ws)
    try:
        workers = []
        t0 = time.perf_counter()
        for _ in range(n):
            host_pid, pidfd, in_w, out_r, err_r = z.fork(
                argv=["--workspace", str(ws), "--role", "read_only"]
            )
            line = read_line(out_r)
            assert b'"type":"ready"' in line, (line, os.read(err_r, 4096))
            workers.append((host_pid, pidfd, in_w, out_r, err_r))
        print(f"{n} workers ready in {time.perf_counter() - t0:.2f} s")
        time.sleep(1)
        ztree = tree(z.proc.pid)
        wpids = {w[0] for w in workers}
        zonly = [p for p in ztree if p.pid not in wpids]
        per = [pss([psutil.Process(w[0])]) for w in workers]
        print("zygote tree (bwrap x2 + zygote):", f"{pss(zonly):.1f} MB PSS",
              [(p.name(), round(p.memory_full_info().pss / 1e6, 1)) for p in zonly])
        print("per worker PSS MB:", [round(x, 1) for x in per])
        print("per worker USS MB:", [round(psutil.Process(w[0]).memory_full_info().uss / 1e6, 1) for w in workers])
        print("per worker RSS MB:", [round(psutil.Process(w[0]).memory_info().rss / 1e6, 1) for w in workers])
        print(f"pool of {n} total incl. zygote: {sum(per) + pss(zonly):.1f} MB PSS")
        print("load", os.getloadavg())
    finally:
        z.close()


if __name__ == "__main__":
    attack_main() if sys.argv[1:] == ["attack"] else main()
