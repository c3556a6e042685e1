# The commit log: chunk-native, segmented, indexed, CRC-checked storage of one partition.
# This file only re-exports the public names; see commitlog.py for the entry point.
from .chunk import ChunkHeader, encode_entries, iter_records
from .commitlog import CommitLog
from .compaction import CompactionPoint, CompactionResult
from .recovery import RecoveryReport
from .segment import ChunkSlice
from .spans import ChunkSpan

__all__ = ["ChunkHeader", "ChunkSlice", "ChunkSpan", "CommitLog", "CompactionPoint",
           "CompactionResult", "RecoveryReport", "encode_entries", "iter_records"]
