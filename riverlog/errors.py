# Error types shared across riverlog. Each says what went wrong and what the caller should do;
# protocol doors map them to their own error codes. No imports from the rest of the package.


class RiverlogError(Exception):
    """Base of every error riverlog raises on purpose."""


class LogError(RiverlogError):
    """A commit-log operation could not be done."""


class LogClosedError(LogError):
    """The commit log was closed (or deleted); open it again to use it."""


class CorruptChunkError(LogError):
    """A chunk read from disk failed its checks (magic, offset, length or CRC-32).

    Raised by reads, never by open: open truncates a corrupt tail instead. Seeing this
    means bytes changed under a chunk that was already trusted (disk or file damage);
    the data before ``offset`` is still readable, and ``riverlog log verify`` reports
    the extent of the damage.
    """

    def __init__(self, path: str, position: int, offset: int, reason: str) -> None:
        super().__init__(f"corrupt chunk at {path}:{position} (offset {offset}): {reason}")
        self.path = path
        self.position = position
        self.offset = offset
        self.reason = reason


class EpochCheckpointError(LogError):
    """A partition's leader-epoch checkpoint file does not parse (``path``, ``reason``).

    Opening the commit log does not fail on it: the log logs it, rebuilds the entries from the
    epochs of its chunks and rewrites the file.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"corrupt leader-epoch checkpoint {path}: {reason}")
        self.path = path
        self.reason = reason


class ChunkRefusedError(LogError):
    """A follower refused chunks from its leader (``CommitLog.append_chunks``): a chunk failed
    its checks (header, CRC-32), did not start at the log's next offset ``offset``, or carried
    an older leader epoch. Nothing of it was appended: fetch again from ``offset`` (after
    truncating to the leader's epoch end offset, when the leader changed)."""

    def __init__(self, directory: str, offset: int, reason: str) -> None:
        super().__init__(f"chunk refused by the log {directory} at offset {offset}: {reason}")
        self.directory = directory
        self.offset = offset
        self.reason = reason


class UncommittedTruncatedError(LogError):
    """Records waiting for their commit were removed by a truncation (a deposed leader drops
    the divergent tail its followers never had): they are not stored, their confirm or ack
    is never given; publish them again (to the partition's new leader)."""


class LogFailedError(LogError):
    """The commit log stopped taking writes after an I/O error it cannot write past: an EIO
    on write, or a failed fsync (after which the page cache cannot be trusted to hold what
    the disk lacks: PostgreSQL's and Kafka's lesson). Nothing written after its last good
    fsync is confirmed; what was confirmed stays readable. Restart the server: the log is
    then recovered from what the disk holds (docs/operations.md "Storage faults")."""


class OffsetOutOfRangeError(LogError):
    """The requested offset is not in the log (removed by retention, or not yet written)."""


class StreamNotFoundError(RiverlogError):
    """No stream has that name (or that partition)."""


class StreamExistsError(RiverlogError):
    """A stream with that name exists already."""


class InvalidArgumentError(RiverlogError, ValueError):
    """A request carried a value the server cannot accept; the message names it."""


class NoSuchVhostError(InvalidArgumentError):
    """The stream's virtual host does not exist (it was deleted while the request was on its
    way): nothing was created. The management API answers 404, the RabbitMQ Stream door
    0x11 precondition failed."""


class ReservedStreamError(InvalidArgumentError):
    """The stream is one of the server's internal streams (``__cursors``, ``__activity``):
    only the server creates, writes and keeps it; no client may create, delete or publish to
    it, on any door."""


class ClusterUnavailableError(RiverlogError):
    """The cluster metadata could not take a change now (no Raft leader, or its outcome is
    unknown): read the metadata, then try again."""


class ResourceExhaustedError(RiverlogError, OSError):
    """The server has no file descriptor (or other bounded resource) left for this one
    operation; nothing of it was kept. Other requests go on; try again later, or raise the
    limit (RLIMIT_NOFILE, ``riverlog.log.open.files``). Doors answer it with their resource
    error (gRPC RESOURCE_EXHAUSTED)."""


class LimitExceededError(RiverlogError):
    """A per-user limit (``SecurityConfig.max_streams_per_user``) refuses this request; the
    user must delete something first, or an operator raise the limit. Doors answer it as
    RabbitMQ answers a queue over its user's or virtual host's ``max-queues`` (0x11
    precondition failed) or gRPC RESOURCE_EXHAUSTED ("perhaps a per-user quota")."""
