# The harness's network: one network namespace per server, each with a veth pair into a
# bridge in the harness's own namespace, and the fault that needs it, a server cut off from
# the others: an nftables table in that server's namespace drops every packet to or from the
# other servers' addresses (a silent drop, as a pulled cable; the harness, at the bridge's
# address, still reaches every server, so it sees what the cut-off one does). tc netem does
# not work on these machines; nftables and namespaces do.
# Rules: every name made here starts with PREFIX, and nothing else is touched; teardown()
# kills what still runs in the namespaces (processes this harness started there) and
# removes every namespace, link and table, and it runs before setup too, for what a run
# killed with SIGKILL left behind. Needs root, iproute2 and nftables (`apt-get install
# nftables`).
from __future__ import annotations

import os
import signal
import subprocess

PREFIX = "rlfault"
SUBNET = "10.213.7"
"""A /24 for the bridge (.1, the harness) and the servers (.11, .12, ...)."""
BRIDGE = f"{PREFIX}-br"
HARNESS_ADDRESS = f"{SUBNET}.1"
CUT_TABLE = f"{PREFIX}_cut"


class NetworkError(RuntimeError):
    """A command setting up or changing the network failed (its stderr in the message)."""


def _run(*argv: str, check: bool = True) -> str:
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode:
        raise NetworkError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _ours(lines: str) -> list[str]:
    """The names among ``ip`` output lines ("name ..." or "N: name@peer: ...") that start
    with PREFIX."""
    names = []
    for line in lines.splitlines():
        words = line.split()
        if not words:
            continue
        name = words[1] if words[0].endswith(":") else words[0]
        name = name.rstrip(":").split("@")[0]
        if name.startswith(PREFIX):
            names.append(name)
    return names


class Network:
    """``servers`` namespaces ``rlfault-0``... at ``10.213.7.11``... on bridge
    ``rlfault-br`` (``10.213.7.1``, the harness). ``setup()``, ``cut(i)``, ``heal(i)``,
    ``teardown()``; ``prefix(i)`` runs a command in namespace i."""

    def __init__(self, servers: int) -> None:
        self.namespaces = [f"{PREFIX}-{i}" for i in range(servers)]
        self.addresses = [f"{SUBNET}.{11 + i}" for i in range(servers)]
        self.cut_off: set[int] = set()

    def prefix(self, index: int) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[index]]

    def setup(self) -> None:
        """Teardown of any leftover, then the bridge, the namespaces and their links.
        Raises NetworkError (not root, no iproute2)."""
        self.teardown()
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{HARNESS_ADDRESS}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        for i, (ns, address) in enumerate(zip(self.namespaces, self.addresses)):
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", f"{PREFIX}-v{i}", "type", "veth", "peer", "name",
                 "eth0", "netns", ns)
            _run("ip", "link", "set", f"{PREFIX}-v{i}", "master", BRIDGE, "up")
            _run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")

    def cut(self, index: int) -> None:
        """Drop every packet between server ``index`` and the other servers, both ways."""
        others = ", ".join(a for i, a in enumerate(self.addresses) if i != index)
        rules = (f"table inet {CUT_TABLE} {{\n"
                 f" chain input {{ type filter hook input priority 0; ip saddr {{ {others} }}"
                 " drop; }\n"
                 f" chain output {{ type filter hook output priority 0; ip daddr {{ {others} }}"
                 " drop; }\n}\n")
        done = subprocess.run([*self.prefix(index), "nft", "-f", "-"], input=rules,
                              capture_output=True, text=True)
        if done.returncode:
            raise NetworkError(f"nft in {self.namespaces[index]}: {done.stderr.strip()}")
        self.cut_off.add(index)

    def heal(self, index: int) -> None:
        _run(*self.prefix(index), "nft", "delete", "table", "inet", CUT_TABLE)
        self.cut_off.discard(index)

    def teardown(self) -> None:
        """Kill what runs in our namespaces, delete their tables, links and the namespaces,
        then the bridge. Never raises for what is already gone."""
        for ns in _ours(_run("ip", "netns", "list", check=False)):
            for pid in _run("ip", "netns", "pids", ns, check=False).split():
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.kill(int(pid), sig)
                    except ProcessLookupError:
                        pass
            _run("ip", "netns", "exec", ns, "nft", "delete", "table", "inet", CUT_TABLE,
                 check=False)
        for link in _ours(_run("ip", "-o", "link", "show", check=False)):
            if link != BRIDGE:
                _run("ip", "link", "del", link, check=False)
        for ns in _ours(_run("ip", "netns", "list", check=False)):
            _run("ip", "netns", "del", ns, check=False)
        _run("ip", "link", "del", BRIDGE, check=False)
        self.cut_off.clear()
