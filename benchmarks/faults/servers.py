# The servers under test: riverlog's own LocalCluster (what `riverlog cluster up` runs), each
# member in its own network namespace (network.py) and listening on its address there; the
# credentials every client logs in with (the doors are beyond loopback, so guest is refused
# and NATS always has users: docs/security.md), given to every server in one configuration
# file; and the look-ups the harness makes through them (partition metadata, its leader, the
# Raft leader). Rules: every gRPC call carries the credentials; a server that does not
# answer is "no answer" (None), never an exception to the caller.
from __future__ import annotations

import asyncio
import base64
import os
import secrets
import urllib.request

import bcrypt
import grpc

from riverlog.broker.broker import STREAMS_DIR, folder_name
from riverlog.cluster.local import LocalCluster, Member
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge.api_pb2_grpc import APIStub

from .network import Network

STREAM = "faults"
USER = "faults"
PORTS = {"stream": 5552, "grpc": 9292, "nats": 4222, "nats_cluster": 6222, "raft": 7000,
         "metrics": 15692}
"""The same in every namespace: each has its own ports."""


async def close_quietly(closing, timeout: float = 2.0) -> None:
    """Await a client's ``closing`` for ``timeout`` s at most, whatever it raises (the
    server it talked to may be gone)."""
    try:
        await asyncio.wait_for(closing, timeout)
    except Exception:
        pass


class FaultCluster(LocalCluster):
    """Three (or ``servers``) members, member i in namespace i of ``network`` at its
    address, all started with the configuration file that holds USER's bcrypt hash.
    ``password`` is USER's; ``auth`` the gRPC call metadata that logs in as USER."""

    def __init__(self, directory: str, network: Network) -> None:
        members = [Member(f"s{i}", dict(PORTS), address)
                   for i, address in enumerate(network.addresses)]
        super().__init__(directory, len(members), members=members)
        self.network = network
        self.password = secrets.token_urlsafe(16)
        self.auth = (("authorization", "Basic " + base64.b64encode(
            f"{USER}:{self.password}".encode()).decode()),)
        self.config = os.path.join(self.directory, "users.yaml")
        os.makedirs(self.directory, exist_ok=True)
        hashed = bcrypt.hashpw(self.password.encode(), bcrypt.gensalt(4)).decode()
        with open(self.config, "w") as f:
            f.write(f"riverlog:\n  users:\n    {USER}: \"{hashed}\"\n  loopback.users: []\n")
        self.ids = [m.id for m in members]
        self._stubs: dict[str, APIStub] = {}

    @property
    def stubs(self) -> dict[str, APIStub]:
        """A gRPC stub per server (made on first use: inside the event loop)."""
        if not self._stubs:
            self._stubs = {m.id: APIStub(grpc.aio.insecure_channel(
                f"{m.host}:{m.ports['grpc']}")) for m in self.members}
        return self._stubs

    def command(self, member: Member) -> tuple[list[str], dict[str, str]]:
        command, env = super().command(member)
        index = self.members.index(member)
        return [*self.network.prefix(index), *command, "-c", self.config], env

    def alive(self, server: str) -> bool:
        return self.procs[self.ids.index(server)].poll() is None

    def nats_urls(self) -> list[str]:
        return [f"nats://{m.host}:{m.ports['nats']}" for m in self.members]

    def stream_address(self, server: str) -> tuple[str, int]:
        member = self.members[self.ids.index(server)]
        return member.host, member.ports["stream"]

    async def create_stream(self) -> bool:
        """STREAM with one partition, RF 3, minISR 2; True once it exists."""
        try:
            await self.stubs[self.ids[0]].CreateStream(pb.CreateStreamRequest(
                name=STREAM, subject=STREAM, replicationFactor=len(self.ids),
                minIsr=pb.NullableInt32(value=2)), timeout=10, metadata=self.auth)
        except grpc.aio.AioRpcError as exc:
            return exc.code() == grpc.StatusCode.ALREADY_EXISTS
        return True

    async def partition(self, server: str) -> pb.PartitionMetadata | None:
        """Partition 0 of STREAM as ``server``'s FetchMetadata says."""
        try:
            meta = await self.stubs[server].FetchMetadata(
                pb.FetchMetadataRequest(streams=[STREAM]), timeout=1, metadata=self.auth)
        except grpc.aio.AioRpcError:
            return None
        for stream in meta.streamMetadata:
            if stream.name == STREAM and not stream.error and 0 in stream.partitions:
                return stream.partitions[0]
        return None

    async def leader(self, avoid: str | None = None, first: str | None = None) -> str | None:
        """The leader some live server names (``first`` asked first, ``avoid`` last), or
        None."""
        start = self.ids.index(first) if first else 0
        for server in sorted(self.ids[start:] + self.ids[:start], key=lambda s: s == avoid):
            if not self.alive(server):
                continue
            part = await self.partition(server)
            if part is not None and part.leader:
                return part.leader
        return None

    def raft_leader(self) -> str | None:
        """The server whose /metrics says it leads the metadata Raft (blocking)."""
        for member in self.members:
            if not self.alive(member.id):
                continue
            url = f"http://{member.host}:{member.ports['metrics']}/metrics"
            try:
                with urllib.request.urlopen(url, timeout=1) as r:
                    if "riverlog_raft_leader 1.0" in r.read().decode():
                        return member.id
            except OSError:
                continue
        return None

    def partition_folder(self, server: str) -> str:
        return os.path.join(self.directory, server, STREAMS_DIR, folder_name(STREAM), "0")
