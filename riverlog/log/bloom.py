# Chunk bloom filters: which filter values (RabbitMQ Stream filtering) a chunk may hold.
# Owns the filter's bytes (built at write time from the filter values of a chunk's entries),
# the matching a filtered reader does per chunk, and the cache of chunk filters that lets a
# reader skip chunks without reading them (the only file access here: pread). Rules: a
# chunk whose entries carry no filter value has no filter (size 0); bit 0 marks "holds
# entries without a filter value"; matching may say yes wrongly (a false positive: the
# client filters each message again) but never no wrongly. The layout follows osiris
# (osiris_bloom.erl): 16..255 bytes, two bit positions per value in 1..bits-1, bits numbered
# from the most significant bit of byte 0; the hash is ours (MurmurHash3 x64 128-bit via
# mmh3), so filters are riverlog's own.
from __future__ import annotations

from typing import Iterable, Mapping

import mmh3

from . import chunk as chunkfmt

DEFAULT_SIZE = 16
"""Bytes of a chunk's filter (osiris' default; RabbitMQ's ``stream-filter-size-bytes``)."""
MIN_SIZE, MAX_SIZE = 16, 255
FILTER_PREFIX = "filter."
MATCH_UNFILTERED = "match-unfiltered"


def _mask(value: str | bytes, bits: int) -> int:
    """The two bits of ``value`` in a ``bits``-bit filter, as an int mask (bit ``i`` of the
    filter is ``1 << (bits - 1 - i)``)."""
    if isinstance(value, str):
        value = value.encode()
    h1, h2 = mmh3.hash64(value, signed=False)
    return (1 << (bits - 2 - h1 % (bits - 1))) | (1 << (bits - 2 - h2 % (bits - 1)))


def build_bloom(values: Iterable[str | bytes | None], size: int = DEFAULT_SIZE) -> bytes:
    """The filter of a chunk whose entries carry ``values`` (None or empty: an entry without
    a filter value). Returns ``b""`` (no filter) when no entry has a value, else ``size``
    bytes. Raises ``ValueError`` for a size outside 16..255."""
    if not MIN_SIZE <= size <= MAX_SIZE:
        raise ValueError(f"a bloom filter is {MIN_SIZE}..{MAX_SIZE} bytes, not {size}")
    bits = size * 8
    acc = 0
    for value in set(values):
        acc |= _mask(value, bits) if value else 1 << (bits - 1)
    if acc & ((1 << (bits - 1)) - 1) == 0:  # nothing but unfiltered entries
        return b""
    return acc.to_bytes(size, "big")


class ChunkFilter:
    """What a filtered reader wants: chunks that may hold one of ``values`` or, with
    ``match_unfiltered``, entries without a filter value. ``matches(bloom)`` takes a chunk's
    filter bytes (empty for a chunk with none, which holds only unfiltered entries)."""

    __slots__ = ("values", "match_unfiltered", "_masks")

    def __init__(self, values: Iterable[str | bytes], match_unfiltered: bool = False) -> None:
        self.values = tuple(values)
        if not self.values:
            raise ValueError("a chunk filter needs at least one value")
        self.match_unfiltered = match_unfiltered
        self._masks: dict[int, tuple[int, ...]] = {}

    def masks(self, bits: int) -> tuple[int, ...]:
        """The masks to test in a ``bits``-bit filter (cached per size)."""
        masks = self._masks.get(bits)
        if masks is None:
            masks = tuple(_mask(v, bits) for v in self.values)
            if self.match_unfiltered:
                masks += (1 << (bits - 1),)
            masks = self._masks[bits] = masks
        return masks

    def matches(self, bloom: bytes | memoryview) -> bool:
        """False only when the chunk with filter ``bloom`` certainly holds no wanted entry."""
        if not bloom:
            return self.match_unfiltered
        acc = int.from_bytes(bloom, "big")
        for m in self._masks.get(len(bloom) * 8) or self.masks(len(bloom) * 8):
            if acc & m == m:
                return True
        return False

    def __repr__(self) -> str:
        return f"ChunkFilter({self.values!r}, match_unfiltered={self.match_unfiltered})"


def filter_from_properties(properties: Mapping[str, str] | None) -> ChunkFilter | None:
    """The chunk filter a RabbitMQ Subscribe (or ResolveOffsetSpec) asks for with its
    properties ``filter.N`` (any N, the values) and ``match-unfiltered`` (exactly "true";
    anything else is false); None when no ``filter.N`` is given
    (reference/rabbitmq-stream-protocol.md, Subscribe; rabbit_stream_utils:filter_spec)."""
    if not properties:
        return None
    values = [v for k, v in properties.items() if k.startswith(FILTER_PREFIX)]
    if not values:
        return None
    return ChunkFilter(values, properties.get(MATCH_UNFILTERED) == "true")


class BloomCache:
    """The filters of a commit log's chunks, kept per segment once a filtered reader asked
    (index-aligned lists; None: not read yet), so readers skip chunks without reading their
    data. A chunk's filter is read from its segment file (header, then the filter right
    after the data) the first time; chunks appended later are noted as written.
    Owned by ``CommitLog``, which calls ``forget`` when chunks are rewritten or removed."""

    __slots__ = ("_by_base",)

    def __init__(self) -> None:
        self._by_base: dict[int, list[bytes | None]] = {}

    def of(self, seg) -> list[bytes | None]:
        """The filters known of ``seg``'s chunks, index-aligned (None: not read yet); fill
        gaps with ``load``."""
        blooms = self._by_base.get(seg.base_offset)
        if blooms is None:
            blooms = self._by_base[seg.base_offset] = []
        if len(blooms) < len(seg.index):
            blooms.extend([None] * (len(seg.index) - len(blooms)))
        return blooms

    @staticmethod
    def load(seg, blooms: list[bytes | None], i: int) -> bytes | None:
        """Read the filter of chunk ``i`` of ``seg`` into ``blooms`` (see ``of``) and return
        it (``b""``: none); None when the chunk's header does not parse or disagrees with
        the index (the reader then reads the chunk whole, which checks it)."""
        bloom = blooms[i] = _read_bloom(seg, i)
        return bloom

    def appended(self, seg, bloom: bytes) -> None:
        """Chunk ``len(seg.index) - 1`` was just appended to ``seg`` with filter ``bloom``."""
        blooms = self._by_base.get(seg.base_offset)
        if blooms is not None:
            i = len(seg.index) - 1
            if len(blooms) < i:
                blooms.extend([None] * (i - len(blooms)))
            blooms[i:] = [bloom]

    def forget(self, base_offset: int | None = None) -> None:
        """Drop what is known of segment ``base_offset`` (of every segment when None)."""
        if base_offset is None:
            self._by_base.clear()
        else:
            self._by_base.pop(base_offset, None)


def _read_bloom(seg, i: int) -> bytes | None:
    pos = seg.index.positions[i]
    try:
        header = chunkfmt.parse_header(seg.file.pread(chunkfmt.HEADER_SIZE, pos))
    except chunkfmt.ChunkFormatError:
        return None
    if seg.chunk_end(i) - pos not in (header.size, header.legacy_size):
        return None
    if not header.bloom_size:
        return b""
    return seg.file.pread(header.bloom_size, pos + chunkfmt.HEADER_SIZE + header.data_length)
