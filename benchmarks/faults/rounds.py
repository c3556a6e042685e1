# The run: the faults, injected one at a time while every publisher and consumer runs, each
# followed by the checks. A round: wait until the partition is steady (a leader whose ISR
# holds every server), let every door publish, inject the fault, measure each door's failover
# (fault to the first ack of a message sent after it), repair (restart, SIGCONT, heal, restart
# all), wait until steady again, pause the publishers and check (checks.py).
# Faults: "kill" SIGKILL of the partition leader; "stop" SIGSTOP of the leader for stop_s
# (longer than replica.max.lag.time) then SIGCONT; "cut" the leader cut off from the other
# servers by the network for cut_s, then healed; "all" SIGKILL of all three, then all
# restarted (its "failover" is the recovery time). Rules: waits are polls bounded by WAIT_S
# (Stuck when exceeded); what a round found is reported, never stops the run.
from __future__ import annotations

import asyncio
import dataclasses
import random
import signal
import time

from .checks import Mirror, Problem, compare_replicas, replica_bytes
from .consumers import Reader
from .publishers import Publisher
from .servers import FaultCluster

WAIT_S = 120.0
FAILOVER_WAIT_S = 60.0
SETTLE_S = 10.0
KINDS = ("kill", "stop", "cut", "all")


class Stuck(Exception):
    """The cluster did not reach a state within WAIT_S."""


@dataclasses.dataclass
class Round:
    kind: str
    target: str
    raft_leader: bool
    """The fault hit the metadata Raft leader too."""
    failover: dict[str, float | None]
    """Per door: seconds from the fault to its first ack of a message sent after it."""
    problems: list[Problem]
    first: float | None = None
    """Seconds to the first ack on any door whose acks mean committed."""
    high_watermark: int = -1


def schedule(counts: dict[str, int], seed: int) -> list[str]:
    """Every kind ``counts[kind]`` times, spread evenly through the run (ties shuffled)."""
    rng = random.Random(seed)
    slots = [((i + 0.5) / n, rng.random(), kind) for kind, n in counts.items()
             for i in range(n)]
    return [kind for *_, kind in sorted(slots)]


class Run:
    """The faults and checks over one cluster: ``fault(kind)`` runs a round and returns
    its Round (also kept in ``rounds``), ``final_check()`` checks once more at the end;
    ``mirror`` is the committed log as checked, ``events`` what was done when."""

    def __init__(self, cluster: FaultCluster, publishers: list[Publisher],
                 consumers: list[Reader], stop_s: float, cut_s: float, seed: int) -> None:
        self.cluster = cluster
        self.publishers = publishers
        self.consumers = consumers
        self.stop_s, self.cut_s = stop_s, cut_s
        self.rng = random.Random(seed)
        self.mirror = Mirror()
        self.pending: dict[str, list[tuple[int, bytes]]] = {c.label: [] for c in consumers}
        self.rounds: list[Round] = []
        self.events: list[tuple[float, str]] = []
        """(time.monotonic(), what the harness did): to place findings in time."""

    def event(self, what: str) -> None:
        self.events.append((time.monotonic(), what))

    # -- waiting ---------------------------------------------------------------------------
    async def until(self, what: str, check, timeout: float = WAIT_S):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = await check()
            if result:
                return result
            await asyncio.sleep(0.1)
        raise Stuck(f"still not after {timeout:.0f} s: {what}")

    async def steady(self, high_watermark: int = -1):
        """(leader, its partition metadata) once the leader has every server in its ISR
        and a high watermark of at least ``high_watermark``."""
        async def check():
            leader = await self.cluster.leader()
            part = leader and await self.cluster.partition(leader)
            return (leader, part) if part and part.leader == leader and \
                len(part.isr) == len(self.cluster.ids) and \
                part.highWatermark >= high_watermark else None
        return await self.until(f"a leader with every server in sync, high watermark >= "
                                f"{high_watermark}", check)

    async def failover(self, t0: float) -> dict[str, float | None]:
        deadline = t0 + FAILOVER_WAIT_S
        while time.monotonic() < deadline:
            if all(p.first_ack_after(t0) is not None for p in self.publishers):
                break
            await asyncio.sleep(0.05)
        return {p.door: p.first_ack_after(t0) for p in self.publishers}

    async def publishing(self) -> None:
        """Every publisher running and each with an ack of a message sent since."""
        t0 = time.monotonic()
        for publisher in self.publishers:
            publisher.resume()

        async def all_acked():
            return all(p.first_ack_after(t0) is not None for p in self.publishers)
        await self.until("an ack on every door", all_acked)
        await asyncio.sleep(self.rng.uniform(0.2, 1.0))

    # -- faults ----------------------------------------------------------------------------
    async def fault(self, kind: str) -> Round:
        leader, _ = await self.steady()
        raft = await asyncio.to_thread(self.cluster.raft_leader) == leader
        index = self.cluster.ids.index(leader)
        proc = self.cluster.procs[index]
        await self.publishing()
        t0 = time.monotonic()
        if kind == "kill":
            proc.send_signal(signal.SIGKILL)
            self.event(f"SIGKILL {leader}")
            await asyncio.to_thread(proc.wait)
            failover = await self.failover(t0)
            self.cluster.restart(index)
            self.event(f"restart {leader}")
        elif kind == "all":
            for p in self.cluster.procs:
                p.send_signal(signal.SIGKILL)
            self.event("SIGKILL all")
            for p in self.cluster.procs:
                await asyncio.to_thread(p.wait)
            for i in range(len(self.cluster.procs)):
                self.cluster.restart(i)
            self.event("restart all")
            failover = await self.failover(t0)
        else:
            if kind == "stop":
                proc.send_signal(signal.SIGSTOP)
            else:
                await asyncio.to_thread(self.cluster.network.cut, index)
                t0 = time.monotonic()  # from when the rules are in force
            self.event(f"{'SIGSTOP' if kind == 'stop' else 'cut'} {leader}")
            measuring = asyncio.create_task(self.failover(t0))
            await asyncio.sleep(max(0.0, (self.stop_s if kind == "stop" else self.cut_s)
                                    - (time.monotonic() - t0)))
            if kind == "stop":
                proc.send_signal(signal.SIGCONT)
            else:
                await asyncio.to_thread(self.cluster.network.heal, index)
            self.event(f"{'SIGCONT' if kind == 'stop' else 'heal'} {leader}")
            failover = await measuring
        target = "all" if kind == "all" else leader
        committed = [failover[p.door] for p in self.publishers
                     if p.committed and failover[p.door] is not None]
        result = Round(kind, target, raft, failover, [], min(committed, default=None))
        self.rounds.append(result)
        await self.check(result)
        return result

    # -- checks ----------------------------------------------------------------------------
    async def check(self, result: Round) -> None:
        await asyncio.gather(*(p.pause() for p in self.publishers))
        newest = max((a.offset for p in self.publishers if p.committed
                      for a in p.acks[-200:] if a.offset is not None), default=-1)
        try:
            leader, part = await self.steady(newest)
        except Stuck:
            leader, part = await self.steady()
            result.problems.append(Problem("lost", f"the high watermark stays at "
                                           f"{part.highWatermark}, below the acked offset "
                                           f"{newest}"))

        async def settled():  # the leader's whole log committed (paused: it stays put)
            now = await self.cluster.partition(leader)
            return now if now is not None and now.leader == leader and \
                now.highWatermark == now.newestOffset else None
        try:
            part = await self.until("the leader's log committed to its end", settled,
                                    SETTLE_S)
        except Stuck:
            pass  # what is committed is checked; a commit that never comes shows as lost
        high_watermark = part.highWatermark

        async def caught_up():
            parts = [await self.cluster.partition(s) for s in part.isr]
            return all(p is not None and p.highWatermark >= high_watermark for p in parts)
        await self.until("every ISR replica at the high watermark", caught_up)
        copies = {server: await asyncio.to_thread(
            replica_bytes, self.cluster.partition_folder(server))
            for server in [leader, *(s for s in part.isr if s != leader)]}
        problems = await asyncio.to_thread(self.mirror.advance, copies[leader], high_watermark)
        if self.mirror.high_watermark < high_watermark and not problems:
            problems.append(Problem("offset", f"the log of {leader} ends its checked chunks "
                                    f"at {self.mirror.high_watermark}, before the high "
                                    f"watermark {high_watermark}"))
        problems += compare_replicas(copies, len(self.mirror.data))
        for publisher in self.publishers:
            problems += self.mirror.check_acks(publisher.door, publisher.acks,
                                               publisher.committed)
        for consumer in self.consumers:
            found, self.pending[consumer.label] = self.mirror.check_served(
                consumer.label, self.pending[consumer.label] + consumer.take())
            problems += found
        result.problems += problems
        result.high_watermark = high_watermark

    async def final_check(self) -> Round:
        """One more check after the last fault, a few seconds on: a message given up on
        before the last check may have been committed since, and read."""
        await asyncio.sleep(3)
        result = Round("end", "-", False, {}, [])
        self.rounds.append(result)
        await self.check(result)
        return result

    def unchecked_reads(self) -> list[Problem]:
        """Records served past the last checked high watermark: never committed."""
        return [Problem("stale read", f"{server} served {value!r} at offset {offset}, past "
                        f"the final high watermark {self.mirror.high_watermark}")
                for server, served in self.pending.items() for offset, value in served]
