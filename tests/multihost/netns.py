"""Separate hosts on one machine: Linux network namespaces joined by a bridge.

`Network` creates, for one run, a switch namespace that holds a bridge and
one namespace per host, each with loopback up and one veth whose other end is
a port of the bridge. Addresses (10.77.0.0/24) exist only inside the host
namespaces and the root namespace gets nothing of ours, so a host reaches
another only over the "wire". Every name carries the pid of the process that
made it and a random tag (parallel runs never clash); `Network.close`
deletes every namespace it made (the veths and the bridge go with them), and
`sweep` deletes what runs whose process is gone left behind.

`Host.prefix` (``ip netns exec NS``) runs a command on the host; `Host.cut`
and `Host.mend` put its bridge port down and up (a pulled cable). `Forward`
gives a loopback address in this namespace that reaches an address inside a
host: a child process on the host inherits a listening socket made here and
connects on the host's side. That is how the test process, which is on no
host, talks to the services (the client machine of a real cluster).

Run as ``python -m tests.multihost.netns forward FD HOST:PORT`` it is that
child.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Sequence

from services.common.cluster import REPO_ROOT, child_env, die_with_parent

#: First part of every namespace name this module makes: omrumh<pid>x<tag>-<host>.
PREFIX = "omrumh"
SUBNET = "10.77.0"
_NAME = re.compile(rf"^{PREFIX}(\d+)x[0-9a-f]+-")


class NetnsError(RuntimeError):
    """An `ip` command failed; the message names it and what it printed."""


def ip(*args: str) -> str:
    """Run `ip ARGS`; NetnsError naming the command when it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip() or f'exit code {done.returncode}'}")
    return done.stdout


def unavailable() -> str:
    """Why network namespaces cannot be made here ("" when they can)."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"{PREFIX}{os.getpid()}x{secrets.token_hex(3)}-probe"
    try:
        ip("netns", "add", probe)
    except NetnsError as exc:
        return str(exc)
    with contextlib.suppress(NetnsError):
        ip("netns", "del", probe)
    return ""


def sweep() -> list[str]:
    """Delete the namespaces of runs whose process is gone; returns their names."""
    gone = []
    for line in ip("netns", "list").splitlines():
        name = line.split()[0] if line.strip() else ""
        m = _NAME.match(name)
        if not m:
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            with contextlib.suppress(NetnsError):
                ip("netns", "del", name)
                gone.append(name)
        except PermissionError:
            pass
    return gone


@dataclass(frozen=True)
class Host:
    """One host: a network namespace with one address on the bridge."""

    name: str
    netns: str
    address: str
    port: str  # its veth's other end: a port of the bridge in the switch namespace
    switch: str

    @property
    def prefix(self) -> list[str]:
        """Command prefix that runs a program on this host."""
        return ["ip", "netns", "exec", self.netns]

    def cut(self) -> None:
        """Pull the cable: the host's bridge port goes down (nothing passes either way)."""
        ip("-n", self.switch, "link", "set", self.port, "down")

    def mend(self) -> None:
        """Plug it back in."""
        ip("-n", self.switch, "link", "set", self.port, "up")


class Network:
    """A bridge and one namespace per host name (a context manager); hosts[name] is the Host."""

    def __init__(self, names: Sequence[str]) -> None:
        if not names or len(set(names)) != len(names) or len(names) > 250:
            raise ValueError(f"host names {list(names)} must be 1..250 distinct names")
        self.names = list(names)
        self.tag = f"{PREFIX}{os.getpid()}x{secrets.token_hex(3)}"
        self.switch = f"{self.tag}-switch"
        self.hosts: dict[str, Host] = {}
        self._made: list[str] = []

    def _add_netns(self, name: str) -> None:
        ip("netns", "add", name)
        self._made.append(name)
        ip("-n", name, "link", "set", "lo", "up")

    def start(self) -> "Network":
        sweep()
        try:
            self._add_netns(self.switch)
            ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            ip("-n", self.switch, "link", "set", "br0", "up")
            for i, name in enumerate(self.names):
                netns, port, address = f"{self.tag}-{name}", f"port{i}", f"{SUBNET}.{i + 2}"
                self._add_netns(netns)
                ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", netns)
                ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
                ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
                ip("-n", netns, "link", "set", "eth0", "up")
                self.hosts[name] = Host(name, netns, address, port, self.switch)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Delete every namespace made (stop the processes on the hosts first)."""
        for name in reversed(self._made):
            with contextlib.suppress(NetnsError):
                ip("netns", "del", name)
        self._made.clear()

    def __enter__(self) -> "Network":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


class Forward:
    """127.0.0.1:PORT here -> target (host:port) as seen from inside host."""

    def __init__(self, host: Host, target: str) -> None:
        self.target = target
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(64)
            self.address = f"127.0.0.1:{listener.getsockname()[1]}"
            fd = listener.fileno()
            self.proc = subprocess.Popen(
                [*host.prefix, sys.executable, "-m", "tests.multihost.netns", "forward", str(fd), target],
                pass_fds=[fd], cwd=REPO_ROOT, env=child_env(), stdin=subprocess.DEVNULL, start_new_session=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


# --- the forwarding child ----------------------------------------------------------------


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def _serve(conn: socket.socket, host: str, port: int) -> None:
    try:
        upstream = socket.create_connection((host, port), timeout=5)
    except OSError:
        conn.close()
        return
    upstream.settimeout(None)
    with conn, upstream:
        other = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
        other.start()
        _pump(conn, upstream)
        other.join()


def forward_main(fd: int, target: str) -> None:
    die_with_parent()
    host, _, port = target.rpartition(":")
    listener = socket.socket(fileno=fd)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_serve, args=(conn, host, int(port)), daemon=True).start()


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "forward" or not sys.argv[2].isdigit():
        sys.exit("usage: python -m tests.multihost.netns forward FD HOST:PORT")
    forward_main(int(sys.argv[2]), sys.argv[3])
