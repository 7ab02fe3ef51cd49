"""Private emulated network: one network namespace per host, veth pairs to a bridge, `tc` limits.

Layout for H hosts of S slots (the launcher's pid ``P`` in every name, so concurrent launchers
never clash)::

    host namespace:  bridge hvdcP  (10.77.X.1/24)  <- hvdcPh0, hvdcPh1, ...  (host ends of veths)
    namespace hvdcPr0: eth0 10.77.X.10/24 ;  namespace hvdcPr1: eth0 10.77.X.11/24 ; ...

``X`` is the first 10.77.X.0/24 subnet no interface on the host uses. The S ranks of one emulated
host run in its namespace and share its address: traffic between them goes over the namespace's
loopback (not rate-limited, like the fast links inside a node), traffic to other hosts over its
shaped ``eth0``. With S = 1 every rank has its own link (the flat network). The namespaces have
no default route, so a rank can reach only its peers and the bridge address (where the
launcher's rendezvous server listens). Both ends of each veth get the same egress shaping: `tbf`
at the link rate, under a `netem` delay when one is asked for, so every host has a full-duplex
link of that speed to the switch.

Every object is recorded as it is created and :meth:`Network.close` removes them in reverse
order, including the ``/etc/netns/NS/hosts`` files that map the machine's hostname to the
namespace's own address and every host's name (``hvdcP-hostI``) to its address (Horovod
0.28.1's process-set Gloo contexts connect to the address the hostname resolves to, ignoring
HOROVOD_GLOO_IFACE; ``ip netns exec`` bind-mounts that file over /etc/hosts).
"""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

PREFIX = "hvdc"
RANK_IFACE = "eth0"
NETNS_ETC = Path("/etc/netns")
LOCK_FILE = "/run/hvdc-netem.lock"
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21
CLEANUP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_RATE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}


class NetemError(RuntimeError):
    """A network-setup command failed."""


class NetemPermissionError(NetemError):
    """The process lacks the rights or tools to build namespaces and links."""


def parse_rate(rate: str) -> int:
    """``'100mbit'``, ``'1gbit'``, ``'10gbit'``, ``'500kbit'`` -> bits per second."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?)bit", rate.strip().lower())
    if not m:
        raise ValueError(f"rate {rate!r} is not of the form <number>[k|m|g]bit, e.g. 100mbit")
    return int(float(m.group(1)) * _RATE_UNITS[m.group(2)])


def _effective_caps() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def check_rights() -> None:
    """Raise :class:`NetemPermissionError` saying what is missing (tools, root, capabilities)."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise NetemPermissionError(
            f"netem launcher needs the {' and '.join(missing)} command(s) (package iproute2); "
            "not found on PATH")
    caps = _effective_caps()
    lacking = [name for bit, name in ((CAP_NET_ADMIN, "CAP_NET_ADMIN"), (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"))
               if not caps >> bit & 1]
    if lacking:
        who = "root without" if os.geteuid() == 0 else f"uid {os.geteuid()} (not root), without"
        raise NetemPermissionError(
            f"netem launcher needs to create network namespaces, veth links and tc qdiscs, but runs "
            f"as {who} {', '.join(lacking)}. Run it as root (sudo) or in a container with "
            "--cap-add NET_ADMIN --cap-add SYS_ADMIN.")


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run one `ip`/`tc` command; raise :class:`NetemError` (permission-aware) when it fails."""
    proc = subprocess.run(args, capture_output=True, text=True)
    if check and proc.returncode != 0:
        err = proc.stderr.strip()
        cls = NetemPermissionError if "not permitted" in err.lower() or "permission" in err.lower() \
            else NetemError
        raise cls(f"`{' '.join(args)}` failed ({proc.returncode}): {err}")
    return proc


def _free_subnet() -> int:
    used = set(re.findall(r"inet 10\.77\.(\d+)\.", sh("ip", "-4", "addr").stdout))
    for s in range(256):
        if str(s) not in used:
            return s
    raise NetemError("no free 10.77.S.0/24 subnet on this host")


def shaping_commands(dev: str, rate_bps: int, delay_ms: float, netns: Optional[str] = None) -> list:
    """The `tc` commands that shape egress of ``dev``: tbf at ``rate_bps`` (burst = 10 ms of
    traffic, at least 32 KiB), under a netem qdisc when ``delay_ms`` > 0."""
    prefix = ["ip", "netns", "exec", netns, "tc"] if netns else ["tc"]
    burst = max(32 * 1024, rate_bps // 8 // 100)
    tbf = ["tbf", "rate", f"{rate_bps}bit", "burst", str(burst), "latency", "50ms"]
    if delay_ms <= 0:
        return [prefix + ["qdisc", "add", "dev", dev, "root", "handle", "1:"] + tbf]
    return [prefix + ["qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay",
                      f"{delay_ms}ms", "limit", "100000"],
            prefix + ["qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:"] + tbf]


@dataclass
class HostLink:
    """One emulated host's namespace and link (shared by the ranks of that host)."""

    host: int
    netns: str
    host_iface: str
    address: str
    hostname: str


class Network:
    """``hosts`` namespaces on a shaped, private bridge, ``slots`` ranks per namespace (the
    flat network of ``hosts`` ranks by default). Use as a context manager; always cleans up."""

    def __init__(self, hosts: int, rate: str, delay_ms: float = 0.0, tag: Optional[str] = None,
                 slots: int = 1):
        for name, value in (("hosts", hosts), ("slots", slots)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: allowed: an int >= 1")
        self.hosts, self.slots = hosts, slots
        self.ranks = hosts * slots
        self.rate_bps = parse_rate(rate)
        self.delay_ms = delay_ms
        self.tag = f"{PREFIX}{tag if tag is not None else os.getpid()}"
        self.bridge = self.tag
        self.links: list = []
        self.gateway = ""
        self._undo: list = []

    # ---- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> "Network":
        check_rights()
        try:
            with open(LOCK_FILE, "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _do(self, undo: Optional[Callable[[], None]], *cmd: str) -> None:
        sh(*cmd)
        if undo is not None:
            self._undo.append(undo)

    def _build(self) -> None:
        subnet = _free_subnet()
        self.gateway = f"10.77.{subnet}.1"
        hostname = socket.gethostname()
        self._do(lambda: sh("ip", "link", "del", self.bridge, check=False),
                 "ip", "link", "add", self.bridge, "type", "bridge")
        self._do(None, "ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        self._do(None, "ip", "link", "set", self.bridge, "up")
        for h in range(self.hosts):
            link = HostLink(h, f"{self.tag}r{h}", f"{self.tag}h{h}", f"10.77.{subnet}.{10 + h}",
                            f"{self.tag}-host{h}")
            ns, host = link.netns, link.host_iface
            self._do(lambda ns=ns: sh("ip", "netns", "del", ns, check=False), "ip", "netns", "add", ns)
            self._do(lambda h=host: sh("ip", "link", "del", h, check=False),
                     "ip", "link", "add", host, "type", "veth", "peer", "name", RANK_IFACE, "netns", ns)
            self._do(None, "ip", "link", "set", host, "master", self.bridge)
            self._do(None, "ip", "link", "set", host, "up")
            in_ns = ["ip", "netns", "exec", ns]
            self._do(None, *in_ns, "ip", "addr", "add", f"{link.address}/24", "dev", RANK_IFACE)
            self._do(None, *in_ns, "ip", "link", "set", RANK_IFACE, "up")
            self._do(None, *in_ns, "ip", "link", "set", "lo", "up")
            for cmd in shaping_commands(host, self.rate_bps, self.delay_ms) + \
                    shaping_commands(RANK_IFACE, self.rate_bps, self.delay_ms, netns=ns):
                self._do(None, *cmd)
            self.links.append(link)
        for link in self.links:
            self._write_hosts(link, hostname)

    def _write_hosts(self, link: HostLink, hostname: str) -> None:
        folder = NETNS_ETC / link.netns
        folder.mkdir(parents=True, exist_ok=True)
        self._undo.append(lambda: shutil.rmtree(folder, ignore_errors=True))
        (folder / "hosts").write_text(
            f"127.0.0.1 localhost\n{link.address} {hostname} {link.hostname}\n"
            + "".join(f"{o.address} {o.hostname}\n" for o in self.links if o is not link))

    def close(self) -> None:
        """Remove everything this network created, newest first; never raises. Termination
        signals are held back meanwhile, so a second Ctrl-C cannot cut the cleanup short."""
        held = signal.pthread_sigmask(signal.SIG_BLOCK, CLEANUP_SIGNALS)
        try:
            while self._undo:
                try:
                    self._undo.pop()()
                except Exception:  # cleanup must go on whatever one step says
                    pass
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    # ---- measurement ---------------------------------------------------------------------------
    def counters(self) -> list:
        """Per host ``{"sent": bytes, "received": bytes}`` so far, read on the host end of its
        veth (what the host's ranks sent to other hosts is what the host end received)."""
        return [{"sent": read_counter(l.host_iface, "rx_bytes"),
                 "received": read_counter(l.host_iface, "tx_bytes")} for l in self.links]


def read_counter(iface: str, name: str) -> int:
    """``/sys/class/net/IFACE/statistics/NAME`` of the current network namespace."""
    return int(Path(f"/sys/class/net/{iface}/statistics/{name}").read_text())


def leftovers(tag_prefix: str = PREFIX) -> dict:
    """Namespaces, links and /etc/netns folders whose names start with ``tag_prefix``."""
    netns = [line.split()[0] for line in sh("ip", "netns", "list").stdout.splitlines() if line.strip()]
    links = re.findall(r"^\d+: ([^:@]+)", sh("ip", "-o", "link").stdout, flags=re.M)
    etc = [p.name for p in NETNS_ETC.iterdir()] if NETNS_ETC.is_dir() else []
    pick = lambda names: sorted(n for n in names if n.startswith(tag_prefix))
    return {"netns": pick(netns), "links": pick(links), "etc_netns": pick(etc)}
