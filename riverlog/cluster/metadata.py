# Cluster metadata replicated through Raft with pysyncobj (>= 0.3.17; docs/clustering.md).
# Owns: the pysyncobj node of this server (its own TCP transport, journal and snapshot in
# DATA/raft/), pysyncobj's admin request removing a member (sent to a running member), the
# replicated command that applies state.py's transitions, and the bridge
# between pysyncobj's tick thread and the asyncio event loop. Rules: pysyncobj's wire format
# is pickle, so a member never starts without a password, even alone (its port would run any
# pickle sent to it); pysyncobj encrypts and authenticates every message with Fernet, keyed
# from the password, before anything is unpickled; the Raft files are checked (raft_files.py)
# before pysyncobj opens them; a command is applied in pysyncobj's thread on every member in log order, and its
# MetadataError is the command's result, not an exception in that thread; the event loop
# never blocks on Raft (callbacks come back through loop.call_soon_threadsafe). Any member
# accepts a command: pysyncobj forwards it to the Raft leader. Membership is pysyncobj's
# dynamic membership (on in every member, also bootstrapped ones, so any cluster can grow):
# a change is one Raft log entry, in effect on each member as soon as it holds the entry (Raft
# section 6's one-server-at-a-time change), one change at a time (pysyncobj refuses a second
# until the first is committed), and replayed from the journal, or read from the snapshot,
# when a member restarts; a member's own start partners are only where it starts from.
# Operators reach the metadata over the Raft port with the Raft password (as RabbitMQ's
# CLI tools reach a node with the Erlang cookie): pysyncobj's admin requests, and riverlog's
# own `riverlog` request (``admin_at``: read the state, or ADMIN_COMMANDS only).
from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
import os
import threading
import time
from typing import Any, Callable

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.syncobj import SyncObjException
from pysyncobj.utility import TcpUtility, UtilityException

from ..config import ClusterConfig
from ..errors import ClusterUnavailableError
from . import features, raft_files
from .access import COMMANDS as TRANSITIONS
from .state import ClusterState, MetadataError

log = logging.getLogger("riverlog.cluster.metadata")

MEMBERS_POLL_S = 0.02
"""How often add_member looks whether the leader holds the change."""
ADMIN_TIMEOUT_S = 30.0
"""How long an admin request (remove_member_at) waits for its answer."""
LEADER_POLL_S = 0.1
"""How often hand_over_leadership asks whether another member leads."""
TRANSFER_RETRY_S = 3.0
"""How long hand_over_leadership waits for another leader after an accepted transfer
before it asks again: an election lost (election timeouts 1-2 s by default) and the next."""
CONNECTION_RETRY_S = 0.5
"""How often a member dials one it lost (pysyncobj's connectionRetryTime, 5 s by default;
only the member with the greater address dials, transport.py _shouldConnect, so a restarted
member could wait that long to be heard). A refused connect to a stopped member is cheap."""

ADMIN_REQUEST = "riverlog"
"""The pysyncobj utility message riverlog's admin requests travel as: [ADMIN_REQUEST,
command, JSON arguments], answered with one JSON object."""
ADMIN_COMMANDS = ("add_replica", "delete_replica")
"""The metadata commands an operator may submit with admin_at (besides reading "state")."""
_ADMIN_ARGUMENTS = {"stream": str, "index": int, "server": str}

_FAIL_NAMES = {v: k for k, v in vars(FAIL_REASON).items() if k.isupper()}


class RaftConfigError(ValueError):
    """Raft settings this server cannot start with (the message says which and why)."""


class RaftBindError(OSError):
    """The Raft address could not be listened on."""


class RaftUnavailable(ClusterUnavailableError, RuntimeError):
    """A command whose outcome Raft could not report (no leader, queue full, leader changed,
    timed out): it may or may not have been applied; read the metadata before retrying."""


@dataclasses.dataclass(frozen=True, slots=True)
class RaftSettings:
    """One server's Raft member. ``address``: "host:port" this member listens on and the
    others know it by; ``peers``: the other members' addresses (empty: a cluster of one);
    ``password``: the shared secret authenticating and encrypting Raft traffic (required,
    also for a member alone, which still listens on ``address``); ``raft_dir``: where the
    journal and snapshot live (DATA/raft).
    Timings in seconds: pysyncobj's election timeouts (``election_timeout_min``..``_max``,
    heartbeats every tenth of the minimum); ``bind_retries``: attempts, a second apart, to
    listen on ``address`` before RaftBindError."""

    address: str
    raft_dir: str
    peers: tuple[str, ...] = ()
    password: str = ""
    election_timeout_min: float = 1.0
    election_timeout_max: float = 2.0
    bind_retries: int = 5

    def __post_init__(self) -> None:
        if not self.password:
            raise RaftConfigError(
                "a Raft member needs a password (riverlog.raft.password), even alone: Raft "
                "messages are pickles, and without a password anyone who can reach the Raft "
                "port could run code on this server")
        if self.address in self.peers:
            raise RaftConfigError(f"Raft peers list this server's own address {self.address}")

    @classmethod
    def from_config(cls, config: ClusterConfig, data_dir: str) -> RaftSettings:
        """The settings of ``config`` (ServerConfig.cluster), with the files in DATA/raft."""
        return cls(config.raft_address, os.path.join(data_dir, "raft"), config.peer_addresses,
                   config.raft_password)


class _Replicated(SyncObjConsumer):
    """The replicated part: the ClusterState, changed only by ``apply`` in Raft log order.
    pysyncobj snapshots the attributes set after SyncObjConsumer.__init__ (``state``)."""

    def __init__(self, on_change: Callable[[ClusterState], None]) -> None:
        self._on_change = on_change  # before __init__: not part of the snapshot
        self.applied: collections.Counter[str] = collections.Counter()
        """Commands applied here since start, by name (refused ones too; not snapshotted)."""
        super().__init__()
        self.state = ClusterState()

    @replicated
    def apply(self, name: str, arguments: dict[str, Any]) -> object:
        """Apply TRANSITIONS[name]; returns its result, or the MetadataError it raised."""
        transition = TRANSITIONS.get(name)
        self.applied[name] += 1
        if transition is None:  # only a newer riverlog submits one: the feature table failed
            log.error("Raft command %r is unknown to this riverlog (cluster version %d): a "
                      "newer server submitted it; it is not applied here. Upgrade this server",
                      name, features.VERSION)
            return MetadataError(f"unknown metadata command {name!r}: a newer riverlog's "
                                 f"(this one speaks cluster version {features.VERSION})")
        try:
            self.state, result = transition(self.state, **arguments)
        except MetadataError as exc:
            return exc
        except TypeError as exc:  # arguments that do not fit the command
            return MetadataError(f"{name}: {exc}")
        self._on_change(self.state)
        return result

    def _deserialize(self, data: dict[str, Any]) -> None:  # a snapshot was loaded
        super()._deserialize(data)
        self._on_change(self.state)


class RaftMetadata:
    """This server's copy of the cluster metadata, kept in agreement through Raft.

    Construction checks the settings and Raft files, then starts pysyncobj's thread and waits
    (blocking: call it from a thread, e.g. ``asyncio.to_thread``) until ``address`` is
    bound. Raises RaftConfigError, raft_files.RaftFileCorrupt, RaftBindError.
    """

    def __init__(self, settings: RaftSettings) -> None:
        os.makedirs(settings.raft_dir, exist_ok=True)
        raft_files.check(settings.raft_dir, TRANSITIONS)
        self._watchers: list[tuple[asyncio.AbstractEventLoop,
                                   Callable[[ClusterState], None]]] = []
        self._lock = threading.Lock()
        self._replicated = _Replicated(self._changed)
        self._password = settings.password  # step_down's admin requests to itself
        lo, hi = settings.election_timeout_min, settings.election_timeout_max
        conf = SyncObjConf(
            password=settings.password,
            journalFile=os.path.join(settings.raft_dir, raft_files.JOURNAL),
            fullDumpFile=os.path.join(settings.raft_dir, raft_files.SNAPSHOT),
            useFork=False,  # no fork() of a process running an event loop and threads
            raftMinTimeout=lo, raftMaxTimeout=hi, appendEntriesPeriod=lo / 10,
            connectionTimeout=max(3.5, hi), connectionRetryTime=CONNECTION_RETRY_S,
            maxBindRetries=settings.bind_retries,
            dynamicMembershipChange=True,
            # each command sent to the others as it is taken, and its commit told at once
            # (batched, both waited for the next append period: ~0.1-0.2 s per change, a
            # leaving leader's NATS subject unheard that long; docs/clustering.md)
            appendEntriesUseBatch=False)
        self._raft = SyncObj(settings.address, list(settings.peers), conf,
                             consumers=[self._replicated])
        try:
            self._raft.waitBinded()
        except SyncObjException:
            self._raft.destroy_synchronous()
            raise RaftBindError(f"cannot listen for Raft on {settings.address} (in use, or "
                                f"not an address of this machine)") from None
        self._raft._SyncObj__transport.setOnUtilityMessageCallback(ADMIN_REQUEST, self._admin)

    def _admin(self, args: list, answer: Callable[[str, None], None]) -> None:
        """An admin request (admin_at), in pysyncobj's thread, from a peer that proved the
        Raft password: ``["state"]`` is answered with this member's applied metadata
        (``summary``); ``[command, JSON arguments]`` of ADMIN_COMMANDS is applied through
        Raft and answered once applied here, ``{"ok": true}`` or ``{"error": reason}``."""
        command = args[0] if args else None
        if command == "state":
            answer(json.dumps(summary(self.state)), None)
            return
        try:
            arguments = json.loads(args[1]) if len(args) > 1 else {}
            if command not in ADMIN_COMMANDS:
                raise ValueError(f"unknown admin request {command!r}")
            if not (isinstance(arguments, dict) and set(arguments) == set(_ADMIN_ARGUMENTS)
                    and all(type(arguments[k]) is t for k, t in _ADMIN_ARGUMENTS.items())):
                raise ValueError(f"{command} takes stream (a string), index (an integer) and "
                                 f"server (a string), got {arguments!r}")
        except ValueError as exc:
            answer(json.dumps({"error": str(exc)}), None)
            return

        def done(result: object, error: int) -> None:
            if error != FAIL_REASON.SUCCESS:
                reply = {"error": f"Raft did not apply {command}: "
                                  f"{_FAIL_NAMES.get(error, error)} (read the metadata "
                                  f"before trying again)"}
            elif isinstance(result, MetadataError):
                reply = {"error": str(result)}
            else:
                reply = {"ok": True}
            answer(json.dumps(reply), None)
        self._replicated.apply(command, arguments, callback=done)

    def applied_commands(self) -> dict[str, int]:
        """How many commands of each name (state.TRANSITIONS) this member applied since it
        started, refused ones too (a copy; callable from any thread)."""
        return dict(self._replicated.applied)

    @property
    def state(self) -> ClusterState:
        """The metadata as applied here so far (may trail the Raft leader's)."""
        return self._replicated.state

    @property
    def leader(self) -> str | None:
        """The address of the Raft leader this member last heard of, or None."""
        node = self._raft._getLeader()
        return None if node is None else node.address

    @property
    def is_leader(self) -> bool:
        return self._raft._isLeader()

    @property
    def address(self) -> str:
        """This member's Raft address ("host:port")."""
        return self._raft.selfNode.address

    def members(self) -> tuple[str, ...]:
        """The Raft addresses of every member as this one knows them (itself included),
        sorted: its start partners changed by every membership entry it holds."""
        return tuple(sorted({self.address} | {n.address for n in self._raft.otherNodes}))

    def connected(self, address: str) -> bool:
        """Whether the member at ``address`` ("host:port") is this one or one this member
        holds a Raft connection with now (pysyncobj's isNodeConnected: a stopped member drops
        out as its socket closes, a cut-off one within the connection timeout). Cheap,
        callable from any thread."""
        if address == self.address:
            return True
        return any(node.address == address and self._raft.isNodeConnected(node)
                   for node in tuple(self._raft.otherNodes))

    async def add_member(self, address: str, timeout: float = 30.0) -> None:
        """Make the member at ``address`` ("host:port") a voting member of the Raft
        (pysyncobj's addNodeToCluster). Called on the Raft leader, it returns once the
        leader holds the change, committed or not: the change is in effect there from then
        on (Raft's one-server change, section 6), and a cluster of one cannot commit the
        addition of its second member before that member runs. The new member is then
        started with ``members()`` as its partners. Raises RaftUnavailable (no leader,
        another change still in progress, ``address`` already a member: REQUEST_DENIED; no
        outcome within ``timeout`` seconds)."""
        outcome = asyncio.ensure_future(self._outcome(
            lambda done: self._raft.addNodeToCluster(address, callback=done),
            f"adding Raft member {address}", timeout))
        outcome.add_done_callback(lambda f: f.cancelled() or f.exception())  # read, if late
        while address not in self.members():
            if outcome.done():
                outcome.result()  # raises the refusal; else committed, and removed since
                return
            await asyncio.wait({outcome}, timeout=MEMBERS_POLL_S)

    def status(self) -> dict[str, int]:
        """This member's Raft progress: ``term``, ``commit_index`` (of the Raft log) and
        ``last_applied`` (the index applied to ``state``). Cheap and non-blocking (reads
        pysyncobj's counters, the same getStatus reports), callable from any thread."""
        raft = self._raft
        return {"term": raft.raftCurrentTerm, "commit_index": raft.raftCommitIndex,
                "last_applied": raft.raftLastApplied}

    async def submit(self, name: str, /, timeout: float = 30.0, **arguments: Any) -> object:
        """Apply the transition ``name`` (state.TRANSITIONS) with ``arguments`` through Raft
        and return its result once this member has applied it. Waits without blocking the
        loop; commands wait for a leader while there is none. Raises the transition's
        MetadataError, RaftUnavailable (outcome unknown, also after ``timeout`` seconds),
        KeyError for an unknown name, features.FeatureNotActive (a command of a feature some
        server does not have: nothing submitted)."""
        if name not in TRANSITIONS:
            raise KeyError(f"unknown metadata command {name!r}")
        features.check_command(self.state, name)
        return await self._outcome(
            lambda done: self._replicated.apply(name, arguments, callback=done), name, timeout)

    async def _outcome(self, start: Callable[[Callable[[object, int], None]], None],
                       what: str, timeout: float) -> object:
        """``start(callback)`` a pysyncobj command and await the callback's result on the
        loop; raises as ``submit``."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[object] = loop.create_future()

        def done(result: object, error: int) -> None:  # in pysyncobj's thread
            loop.call_soon_threadsafe(_settle, future, result, error)

        start(done)
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise RaftUnavailable(f"{what}: no outcome from Raft within {timeout} s "
                                  f"(leader {self.leader})") from None

    async def step_down(self, timeout: float) -> bool:
        """If this member leads the Raft, hand the leadership to its most caught-up follower
        (``hand_over_leadership``, through pysyncobj's own thread) before a stop: the entries
        this leader committed last reach the others with the next leader's first heartbeat
        instead of after an election timeout. Returns True once another member leads; False
        when this one did not lead or none took over within ``timeout`` seconds."""
        if not self.is_leader:
            return False
        try:
            return await asyncio.to_thread(hand_over_leadership, self.address,
                                           self._password, timeout)
        except RaftUnavailable as exc:
            log.warning("the Raft leadership was not handed over: %s", exc)
            return False

    def watch(self, loop: asyncio.AbstractEventLoop,
              callback: Callable[[ClusterState], None]) -> Callable[[], None]:
        """Call ``callback(state)`` on ``loop`` after every applied change (and once a
        snapshot was loaded). Returns a function that stops the calls."""
        entry = (loop, callback)
        with self._lock:
            self._watchers.append(entry)

        def stop() -> None:
            with self._lock:
                if entry in self._watchers:
                    self._watchers.remove(entry)
        return stop

    def _changed(self, state: ClusterState) -> None:  # in pysyncobj's thread
        with self._lock:
            watchers = list(self._watchers)
        for loop, callback in watchers:
            try:
                loop.call_soon_threadsafe(callback, state)
            except RuntimeError:  # that loop is closed: it will not watch any more
                log.debug("metadata watcher's event loop is closed")

    def close(self) -> None:
        """Stop pysyncobj's thread and close its connections and files (blocking)."""
        self._raft.destroy_synchronous()


def _utility(member: str, message: list, password: str, timeout: float, *addresses: str):
    """Send pysyncobj utility ``message`` to the member at ``member`` ("host:port") and
    return its answer. Raises RaftUnavailable (an address that is no host:port, no answer)."""
    for where in (member, *addresses):
        host, sep, port = where.rpartition(":")
        if not (sep and host and port.isdigit()):
            raise RaftUnavailable(f"{where!r} is no Raft address (host:port)")
    try:
        return TcpUtility(password, timeout).executeCommand(member, message)
    except UtilityException as exc:
        raise RaftUnavailable(f"no answer from the Raft member at {member} ({exc}; a wrong "
                              f"password is disconnected without an answer)") from None


def remove_member_at(member: str, address: str, password: str,
                     timeout: float = ADMIN_TIMEOUT_S) -> None:
    """Ask the running member at ``member`` ("host:port", its Raft address) to take the
    member at ``address`` out of the Raft: pysyncobj's admin request ("remove", encrypted
    with ``password`` as all Raft traffic), forwarded to the Raft leader, answered once
    committed. Blocking. Raises RaftUnavailable saying why (no connection, a wrong
    password, ``address`` no member, the Raft leader's or ``member``'s own address, no
    leader)."""
    answer = _utility(member, ["remove", address], password, timeout, address)
    if answer != f"SUCCESS REMOVE {address}":
        raise RaftUnavailable(f"the Raft did not remove {address}: {answer} (it must be a "
                              f"member, neither the Raft leader nor {member} itself, and a "
                              f"leader must be elected)")


def hand_over_leadership(address: str, password: str, timeout: float = ADMIN_TIMEOUT_S) -> bool:
    """If the member at ``address`` ("host:port") leads the Raft, ask it to hand the
    leadership to its most caught-up follower (pysyncobj's admin request "transfer", Raft's
    TimeoutNow) and return True once another member leads; False when it does not lead or
    does not answer (not running: it leads nothing). Blocking. Raises RaftUnavailable (no
    other leader within ``timeout`` seconds).

    The request is asked again while it is refused (no follower holds the leader's whole
    log yet), and also TRANSFER_RETRY_S after an accepted one that changed nothing: the
    leader may append entries before the chosen follower's vote request arrives, the others
    then refuse that follower, and the former leader, holding the newest log, is elected
    again (CI saw it under a replica move's ISR changes)."""
    deadline = time.monotonic() + timeout
    try:
        status = _utility(address, ["status"], password, timeout)
    except RaftUnavailable:
        return False
    if str(status.get("leader")) != str(status.get("self")):
        return False
    accepted_at = None
    answer = None
    while time.monotonic() < deadline:
        status = _utility(address, ["status"], password, timeout)
        if status.get("leader") is not None and str(status["leader"]) != address:
            return True
        if accepted_at is None or time.monotonic() - accepted_at >= TRANSFER_RETRY_S:
            answer = _utility(address, ["transfer"], password, timeout)
            accepted_at = time.monotonic() if answer == "SUCCESS TRANSFER" else None
        time.sleep(LEADER_POLL_S)
    raise RaftUnavailable(f"the Raft leader {address} did not hand its leadership over within "
                          f"{timeout:g} s (last answer {answer}): try again")


def admin_at(member: str, password: str, command: str, timeout: float = ADMIN_TIMEOUT_S,
             **arguments: Any) -> dict:
    """Ask the running member at ``member`` ("host:port", its Raft address; the Raft
    password ``password``) for riverlog's admin request ``command``: "state" returns
    ``summary`` of its applied metadata; one of ADMIN_COMMANDS (with ``arguments``, JSON
    values) is applied through Raft and returns ``{"ok": True}``. Blocking. Raises
    MetadataError (the command was refused; the message says why), RaftUnavailable (no
    answer, or Raft could not apply it: the outcome is unknown)."""
    answer = _utility(member, [ADMIN_REQUEST, command, json.dumps(arguments)], password,
                      timeout)
    try:
        reply = json.loads(answer)
    except (TypeError, ValueError):
        raise RaftUnavailable(f"the Raft member at {member} answered {answer!r}: not a "
                              f"riverlog server of this version?") from None
    error = reply.get("error")
    if error is not None:
        if error.startswith("Raft did not apply"):
            raise RaftUnavailable(error)
        raise MetadataError(error)
    return reply


def summary(state: ClusterState) -> dict:
    """``state`` as JSON values: ``servers`` (id -> Raft address "host:port", or None),
    ``streams`` (name -> one dict per partition: ``index``, ``replicas``, ``isr``,
    ``leader``, ``leader_epoch``, ``min_isr``) and ``super_streams`` (name -> its partition
    streams)."""
    return {"servers": {i: (f"{d.host}:{d.port}" if (d := server.doors.get("raft")) else None)
                        for i, server in state.servers.items()},
            "streams": {name: [{"index": p.index, "replicas": list(p.replicas),
                                "isr": list(p.isr), "leader": p.leader,
                                "leader_epoch": p.leader_epoch,
                                "min_isr": max(1, int(stream.config.get("min_isr") or 1))}
                               for p in stream.partitions]
                        for name, stream in state.streams.items()},
            "super_streams": {name: list(s.partitions) for name, s in state.super_streams.items()}}


def _settle(future: asyncio.Future[object], result: object, error: int) -> None:
    if future.done():  # the waiter gave up (timeout, cancelled)
        return
    if error != FAIL_REASON.SUCCESS:
        future.set_exception(RaftUnavailable(
            f"Raft did not apply the command: {_FAIL_NAMES.get(error, error)}"))
    elif isinstance(result, MetadataError):
        future.set_exception(result)
    else:
        future.set_result(result)

