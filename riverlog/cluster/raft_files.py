# The Raft files of one server (DATA/raft/), checked before pysyncobj opens them. Owns: their
# names and the check. Rules: pysyncobj reads its files without reporting damage (a bad
# record size or pickle fails inside its tick thread, over and over; an unreadable
# journal.meta silently forgets the current term and vote), so every file is read through
# here first and any damage stops the start with RaftFileCorrupt naming the file: the
# operator restores it or removes DATA/raft so the server rejoins empty and catches up
# from the other servers. Formats are pysyncobj 0.3.17's (pysyncobj/journal.py,
# serializer.py): the journal is a header (name, version, format version, end offset) then
# records (u32 size, u64 index, u64 term, command, u32 size), little-endian, with no
# checksum, so damage inside a command that still unpickles is not seen; journal.meta is a
# pickled dict (term, vote, commit index); the snapshot is gzip (CRC-checked) of a pickle.
# ``members`` is riverlog's: the Raft addresses a joining server was given by the Raft leader
# (riverlog.cluster.join), a JSON list of "host:port" strings, written (atomically, fsynced)
# before its Raft member first starts; a server that has it restarts from it and its journal
# without asking to join again. Versions (docs/clustering.md "Versions"): a journal entry is a
# command by name, which came with a cluster version (features.COMMAND_VERSIONS); a name this
# riverlog does not know, a class it does not have or a snapshot with metadata fields it does
# not know was written by a newer riverlog, and the start stops with RaftFileNewer.
from __future__ import annotations

import gzip
import json
import os
import pickle
import struct
from typing import Collection

from pysyncobj import journal as raft_journal

from ..errors import RiverlogError
from .access import COMMANDS
from .features import VERSION
from .state import NewerMetadata

JOURNAL = "journal"
META = JOURNAL + ".meta"
SNAPSHOT = "snapshot"
MEMBERS = "members"


class RaftFileNewer(RiverlogError, RuntimeError):
    """A Raft file holding what a newer riverlog wrote (a command this one does not know, a
    snapshot with metadata fields it does not know): refused, never misread. ``path`` names
    it. Upgrade this server."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"Raft file {path} was written by a newer riverlog: {problem}. This "
                         f"riverlog speaks cluster version {VERSION}: run the newer one (a "
                         f"server that ran it cannot go back)")
        self.path = path


class RaftFileCorrupt(RiverlogError, RuntimeError):
    """A Raft file that cannot be read as written; ``path`` names it. Restore the file, or
    remove the server's raft folder so it rejoins empty and copies the metadata from the
    other servers (a single server then starts with empty metadata)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"Raft file {path} is corrupted: {problem}. Restore it from a backup, "
                         f"or remove {os.path.dirname(path)} so this server rejoins the cluster "
                         f"empty and catches up from the others")
        self.path = path


def check(raft_dir: str, commands: Collection[str] = COMMANDS) -> None:
    """Read every Raft file in ``raft_dir`` that exists; raises RaftFileCorrupt on damage,
    RaftFileNewer for a journal command not in ``commands`` (the names this riverlog
    applies: RaftMetadata passes its own) or metadata this riverlog does not know."""
    _check_journal(os.path.join(raft_dir, JOURNAL), commands)
    _check_meta(os.path.join(raft_dir, META))
    _check_snapshot(os.path.join(raft_dir, SNAPSHOT))
    read_members(raft_dir)


def has_journal(raft_dir: str) -> bool:
    """Whether a Raft member ran in ``raft_dir`` (its journal exists)."""
    return os.path.exists(os.path.join(raft_dir, JOURNAL))


def read_members(raft_dir: str) -> tuple[str, ...] | None:
    """The members file's Raft addresses, None when there is none. Raises RaftFileCorrupt."""
    path = os.path.join(raft_dir, MEMBERS)
    try:
        with open(path, "rb") as f:
            members = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RaftFileCorrupt(path, f"unreadable ({exc})") from None
    if not isinstance(members, list) or not all(isinstance(m, str) and ":" in m
                                                for m in members):
        raise RaftFileCorrupt(path, "not a list of host:port Raft addresses")
    return tuple(members)


def write_members(raft_dir: str, members: tuple[str, ...]) -> None:
    """Keep ``members`` in the members file (replaced atomically, fsynced)."""
    path = os.path.join(raft_dir, MEMBERS)
    with open(path + ".tmp", "w") as f:
        json.dump(list(members), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def _check_journal(path: str, commands: Collection[str]) -> None:
    if not os.path.exists(path):
        return
    with open(path, "rb") as f:
        data = f.read()
    first = raft_journal.FIRST_RECORD_OFFSET
    if len(data) < first:
        raise RaftFileCorrupt(path, f"{len(data)} bytes, shorter than the {first}-byte header")
    name = data[:raft_journal.NAME_SIZE].rstrip(b"\0")
    version_at = raft_journal.NAME_SIZE + raft_journal.VERSION_SIZE
    (fmt,) = struct.unpack_from("<I", data, version_at)
    if name != raft_journal.APP_NAME or fmt != raft_journal.JOURNAL_FORMAT_VERSION:
        raise RaftFileCorrupt(path, f"not a pysyncobj journal of format "
                                    f"{raft_journal.JOURNAL_FORMAT_VERSION}")
    (end,) = struct.unpack_from("<I", data, raft_journal.LAST_RECORD_OFFSET_OFFSET)
    if not first <= end <= len(data):
        raise RaftFileCorrupt(path, f"records end at {end}, outside {first}..{len(data)}")
    offset, previous = first, None
    while offset < end:
        if offset + 4 > end:
            raise RaftFileCorrupt(path, f"record at {offset} cut short")
        (size,) = struct.unpack_from("<I", data, offset)
        if size < 17 or offset + size + 8 > end:
            raise RaftFileCorrupt(path, f"record at {offset} has a bad size {size}")
        (trailer,) = struct.unpack_from("<I", data, offset + 4 + size)
        if trailer != size:
            raise RaftFileCorrupt(path, f"record at {offset}: sizes {size} and {trailer} differ")
        idx, term = struct.unpack_from("<QQ", data, offset + 4)
        if previous is not None and (idx != previous[0] + 1 or term < previous[1]):
            raise RaftFileCorrupt(path, f"record at {offset}: entry {idx} term {term} cannot "
                                        f"follow entry {previous[0]} term {previous[1]}")
        _check_command(path, offset, data[offset + 20:offset + 4 + size], commands)
        previous = (idx, term)
        offset += size + 8


def _check_command(path: str, offset: int, command: bytes, commands: Collection[str]) -> None:
    kind = command[0]
    if kind == 1:  # pysyncobj's _COMMAND_TYPE.NO_OP: nothing follows
        return
    if kind not in (0, 2, 3):  # REGULAR, MEMBERSHIP, VERSION: a pickle follows
        raise RaftFileCorrupt(path, f"record at {offset}: unknown command type {kind}")
    try:
        loaded = pickle.loads(command[1:])
    except AttributeError as exc:  # a class this riverlog does not have
        raise RaftFileNewer(path, f"record at {offset}: {exc}") from None
    except Exception as exc:  # any other unpickling failure is damage here
        raise RaftFileCorrupt(path, f"record at {offset}: command unreadable ({exc!r})") from None
    name = _command_name(loaded) if kind == 0 else None
    if name is not None and name not in commands:
        raise RaftFileNewer(path, f"record at {offset} is metadata command {name!r}, which "
                                  f"this riverlog does not know")


def _command_name(loaded: object) -> str | None:
    """The metadata command of a pysyncobj REGULAR entry (funcID, (name, arguments), ...)
    of RaftMetadata's one replicated method; None for anything else."""
    if isinstance(loaded, tuple) and len(loaded) >= 2 and isinstance(loaded[1], tuple) \
            and loaded[1] and isinstance(loaded[1][0], str):
        return loaded[1][0]
    return None


def _check_meta(path: str) -> None:
    if not os.path.exists(path):
        return
    try:
        with open(path, "rb") as f:
            meta = pickle.load(f)
    except Exception as exc:  # any unpickling failure is damage here
        raise RaftFileCorrupt(path, f"unreadable ({exc!r})") from None
    if not isinstance(meta, dict):
        raise RaftFileCorrupt(path, f"holds a {type(meta).__name__}, not the term and vote")


def _check_snapshot(path: str) -> None:
    if not os.path.exists(path):
        return
    try:
        with gzip.open(path, "rb") as f:
            snapshot = pickle.load(f)
    except (NewerMetadata, AttributeError) as exc:  # more fields, or a class unknown here
        raise RaftFileNewer(path, str(exc)) from None
    except Exception as exc:  # any gzip or unpickling failure is damage here
        raise RaftFileCorrupt(path, f"unreadable ({exc!r})") from None
    if not isinstance(snapshot, tuple) or len(snapshot) < 3:
        raise RaftFileCorrupt(path, "not a pysyncobj snapshot")
