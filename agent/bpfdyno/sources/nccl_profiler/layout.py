"""The plugin's shared-memory file, decoded: the Python side of bpfdyno_nccl.h.

Every size and offset here mirrors the C header (whose _Static_asserts pin the C side); the
tests build the plugin and check the two agree on real files.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

MAGIC = 0x4C43434E44465042  # "BPFDNCCL" little-endian
LAYOUT = 1
COMM_SLOTS = 8
RING_RECORDS = 4096
FILE_PREFIX = "bpfdyno-nccl."

HEADER = struct.Struct("<QIIIIIIQqQQIIIIQ168x")
COMM = struct.Struct("<QQiiiI32s12Q32x")
RECORD = struct.Struct("<QBBBBI8Q")
HEADER_BYTES = HEADER.size
COMM_BYTES = COMM.size
RECORD_BYTES = RECORD.size
COMMS_OFFSET = HEADER_BYTES
RING_OFFSET = COMMS_OFFSET + COMM_SLOTS * COMM_BYTES
FILE_BYTES = RING_OFFSET + RING_RECORDS * RECORD_BYTES
#: Where the agent writes the end of full mode (header.detail_until_ns).
DETAIL_UNTIL_OFFSET = 48

assert (HEADER_BYTES, COMM_BYTES, RECORD_BYTES) == (256, 192, 80)


class RecordKind(enum.IntEnum):
    """What a ring record describes (enum bpfdyno_nccl_kind)."""

    COLL = 1
    P2P = 2
    KERNEL_CH = 3
    PROXY_STEP = 4
    COLL_UPDATE = 5  # a published collective's values after late parts ended
    P2P_UPDATE = 6


#: enum bpfdyno_nccl_func, as NCCL names the operations.
FUNC_NAMES = {
    0: "Other",
    1: "AllReduce",
    2: "AllGather",
    3: "ReduceScatter",
    4: "Broadcast",
    5: "Reduce",
    6: "Send",
    7: "Recv",
}


class LayoutError(ValueError):
    """A file that is not a plugin file of this layout."""


@dataclass(frozen=True, slots=True)
class Header:
    """The file's header (struct bpfdyno_nccl_header)."""

    pid: int
    start_ticks: int
    realtime_offset_ns: int
    detail_until_ns: int
    ring_head: int
    comms_dropped: int
    api_version: int
    activation_mask: int
    colls_dropped: int
    offset_measured_ns: int


@dataclass(frozen=True, slots=True)
class CommSlot:
    """One communicator's cumulative aggregates (struct bpfdyno_nccl_comm); times in ns."""

    gen: int
    comm_id: int
    rank: int
    nranks: int
    nnodes: int
    state: int  # 0 free, 1 live, 2 finalized
    name: str
    colls_started: int
    last_seq_started: int
    colls_completed: int
    last_seq_completed: int
    coll_ns_total: int
    gpu_ns_total: int
    net_wait_ns_total: int
    bytes_total: int
    last_start_ns: int
    last_done_ns: int
    p2p_completed: int
    p2p_ns_total: int


@dataclass(frozen=True, slots=True)
class Record:
    """One ring record (struct bpfdyno_nccl_record); CPU times on CLOCK_MONOTONIC, ns."""

    commit: int
    kind: int
    comm_slot: int
    func: int
    channel: int
    extra: int
    seq: int
    start_ns: int
    duration_ns: int
    gpu_start_ns: int
    gpu_stop_ns: int
    net_wait_ns: int
    bytes: int
    enqueue_ns: int


def decode_header(data: bytes) -> Header:
    """The header of a file's first HEADER_BYTES; LayoutError when it is not this layout."""
    if len(data) < HEADER_BYTES:
        raise LayoutError(f"header is {len(data)} bytes, not {HEADER_BYTES}")
    (
        magic,
        layout,
        header_bytes,
        pid,
        slots,
        records,
        record_bytes,
        start_ticks,
        rt_offset,
        detail_until,
        head,
        dropped,
        api,
        mask,
        colls_dropped,
        offset_measured_ns,
    ) = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise LayoutError("no plugin magic (not a bpfdyno NCCL file, or not yet initialised)")
    found = (layout, header_bytes, slots, records, record_bytes)
    wanted = (LAYOUT, HEADER_BYTES, COMM_SLOTS, RING_RECORDS, RECORD_BYTES)
    if found != wanted:
        raise LayoutError(
            f"layout {found} (version, header, slots, records, record size) is not this agent's "
            f"{wanted}: run the plugin library built from this agent's version"
        )
    return Header(
        pid,
        start_ticks,
        rt_offset,
        detail_until,
        head,
        dropped,
        api,
        mask,
        colls_dropped,
        offset_measured_ns,
    )


def decode_comm(data: bytes, offset: int) -> CommSlot:
    """The comm slot at offset in data."""
    f = COMM.unpack_from(data, offset)
    name = f[6].split(b"\0", 1)[0].decode("utf-8", "replace")
    values: list[object] = [*f[:6], name, *f[7:]]
    return CommSlot(*values)  # type: ignore[arg-type]


def decode_record(data: bytes, offset: int) -> Record:
    """The ring record at offset in data."""
    return Record(*RECORD.unpack_from(data, offset))
