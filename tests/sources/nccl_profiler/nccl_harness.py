"""Drives the NCCL profiler plugin the way NCCL does, through its exported ncclProfiler_v5.

The ctypes structures below are declared from NCCL's documented v5 ABI independently of the
plugin's C header (tests check both against the same sizes and offsets). The harness owns the
plugin's clock (the library's ``bpfdyno_nccl_clock`` hook), so every CPU time it reports is
one the test chose; GPU times come in the descriptors, as NCCL passes them.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

NCCL_PROFILE_GROUP = 1 << 0
NCCL_PROFILE_COLL = 1 << 1
NCCL_PROFILE_P2P = 1 << 2
NCCL_PROFILE_PROXY_OP = 1 << 3
NCCL_PROFILE_PROXY_STEP = 1 << 4
NCCL_PROFILE_KERNEL_CH = 1 << 6

SEND_GPU_WAIT = 8
SEND_WAIT = 9
RECV_WAIT = 10
RECV_FLUSH_WAIT = 11
RECV_GPU_WAIT = 12
SEND_PEER_WAIT_V4 = 20
KERNEL_CH_STOP = 22


class _Coll(ctypes.Structure):
    _fields_ = [
        ("seqNumber", ctypes.c_uint64),
        ("func", ctypes.c_char_p),
        ("sendBuff", ctypes.c_void_p),
        ("recvBuff", ctypes.c_void_p),
        ("count", ctypes.c_size_t),
        ("root", ctypes.c_int),
        ("datatype", ctypes.c_char_p),
        ("nChannels", ctypes.c_uint8),
        ("nWarps", ctypes.c_uint8),
        ("algo", ctypes.c_char_p),
        ("proto", ctypes.c_char_p),
        ("parentGroup", ctypes.c_void_p),
    ]


class _P2p(ctypes.Structure):
    _fields_ = [
        ("func", ctypes.c_char_p),
        ("buff", ctypes.c_void_p),
        ("datatype", ctypes.c_char_p),
        ("count", ctypes.c_size_t),
        ("peer", ctypes.c_int),
        ("nChannels", ctypes.c_uint8),
        ("parentGroup", ctypes.c_void_p),
    ]


class _ProxyOp(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_int),
        ("channelId", ctypes.c_uint8),
        ("peer", ctypes.c_int),
        ("nSteps", ctypes.c_int),
        ("chunkSize", ctypes.c_int),
        ("isSend", ctypes.c_int),
    ]


class _ProxyStep(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int)]


class _KernelCh(ctypes.Structure):
    _fields_ = [("channelId", ctypes.c_uint8), ("pTimer", ctypes.c_uint64)]


class _DescrUnion(ctypes.Union):
    _fields_ = [
        ("coll", _Coll),
        ("p2p", _P2p),
        ("proxyOp", _ProxyOp),
        ("proxyStep", _ProxyStep),
        ("kernelCh", _KernelCh),
    ]


class EventDescr(ctypes.Structure):
    """ncclProfilerEventDescr_v5_t."""

    _anonymous_ = ("u",)
    _fields_ = [
        ("type", ctypes.c_uint64),
        ("parentObj", ctypes.c_void_p),
        ("rank", ctypes.c_int),
        ("u", _DescrUnion),
    ]


class _CollV4(ctypes.Structure):
    _fields_ = _Coll._fields_[:-1]  # no parentGroup


class _P2pV4(ctypes.Structure):
    _fields_ = _P2p._fields_[:-1]


class _DescrUnionV4(ctypes.Union):
    _fields_ = [
        ("coll", _CollV4),
        ("p2p", _P2pV4),
        ("proxyOp", _ProxyOp),
        ("proxyStep", _ProxyStep),
        ("kernelCh", _KernelCh),
    ]


class EventDescrV4(ctypes.Structure):
    """ncclProfilerEventDescr_v4_t: a one-byte type, the union without parentGroup."""

    _anonymous_ = ("u",)
    _fields_ = [
        ("type", ctypes.c_uint8),
        ("parentObj", ctypes.c_void_p),
        ("rank", ctypes.c_int),
        ("u", _DescrUnionV4),
    ]


class StateArgs(ctypes.Union):
    """ncclProfilerEventStateArgs_v5_t (the members this harness sets)."""

    _fields_ = [("transSize", ctypes.c_size_t), ("pTimer", ctypes.c_uint64)]


Logger = ctypes.CFUNCTYPE(
    None, ctypes.c_int, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p
)
Clock = ctypes.CFUNCTYPE(ctypes.c_uint64)
Handle = ctypes.c_void_p


class ProfilerV5(ctypes.Structure):
    """ncclProfiler_v5_t."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        (
            "init",
            ctypes.CFUNCTYPE(
                ctypes.c_int,
                ctypes.POINTER(ctypes.c_void_p),
                ctypes.c_uint64,
                ctypes.POINTER(ctypes.c_int),
                ctypes.c_char_p,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                Logger,
            ),
        ),
        (
            "startEvent",
            ctypes.CFUNCTYPE(
                ctypes.c_int,
                ctypes.c_void_p,
                ctypes.POINTER(ctypes.c_void_p),
                ctypes.POINTER(EventDescr),
            ),
        ),
        ("stopEvent", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)),
        (
            "recordEventState",
            ctypes.CFUNCTYPE(
                ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(StateArgs)
            ),
        ),
        ("finalize", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)),
    ]


def _table(descr: type[ctypes.Structure], init_v4: bool) -> type[ctypes.Structure]:
    """The function table of one API version (v4: init takes the name before the id)."""
    ptr = ctypes.POINTER
    init_args = (
        [ptr(ctypes.c_void_p), ptr(ctypes.c_int), ctypes.c_char_p, ctypes.c_uint64]
        if init_v4
        else [ptr(ctypes.c_void_p), ctypes.c_uint64, ptr(ctypes.c_int), ctypes.c_char_p]
    )

    class Table(ctypes.Structure):
        _fields_ = [
            ("name", ctypes.c_char_p),
            ("init", ctypes.CFUNCTYPE(ctypes.c_int, *init_args, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_int, Logger)),
            ("startEvent", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ptr(ctypes.c_void_p),
                                            ptr(descr))),
            ("stopEvent", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)),
            ("recordEventState", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                                  ptr(StateArgs))),
            ("finalize", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)),
        ]  # fmt: skip

    return Table


ProfilerV4 = _table(EventDescrV4, init_v4=True)


class Plugin:
    """The loaded library, its clock set by the test (``plugin.now = ns``), driven through
    its ncclProfiler_v5 table, or its ncclProfiler_v4 one (``version=4``)."""

    def __init__(self, library: Path, version: int = 5) -> None:
        self.lib = ctypes.CDLL(str(library), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        self.version = version
        self.descr: Any = EventDescr if version == 5 else EventDescrV4
        table = ProfilerV5 if version == 5 else ProfilerV4
        self.api = table.in_dll(self.lib, f"ncclProfiler_v{version}")
        self.now = 0
        self._clock = Clock(lambda: self.now)  # kept referenced while installed
        self._hook = ctypes.c_void_p.in_dll(self.lib, "bpfdyno_nccl_clock")
        self._hook.value = ctypes.cast(self._clock, ctypes.c_void_p).value
        self.logged: list[str] = []
        self.contexts: set[int] = set()
        self._logger = Logger(self._log)

    def _log(self, level: int, flags: int, file: bytes, line: int, fmt: bytes) -> None:
        self.logged.append(fmt.decode())

    def real_clock(self) -> None:
        """Hands the clock back to CLOCK_MONOTONIC."""
        self._hook.value = None

    def init(
        self, comm_id: int, name: str = "world", nnodes: int = 1, nranks: int = 2, rank: int = 0
    ) -> tuple[int, int, int]:
        """init as NCCL calls it per communicator: (result, context, activation mask)."""
        ctx = ctypes.c_void_p()
        mask = ctypes.c_int(0)
        if self.version == 5:
            args = (ctypes.byref(ctx), comm_id, ctypes.byref(mask), name.encode())
        else:
            args = (ctypes.byref(ctx), ctypes.byref(mask), name.encode(), comm_id)
        rc = self.api.init(*args, nnodes, nranks, rank, self._logger)
        if ctx.value:
            self.contexts.add(ctx.value)
        return rc, ctx.value or 0, mask.value

    def finalize(self, ctx: int) -> int:
        self.contexts.discard(ctx)
        return int(self.api.finalize(ctx))

    def close(self) -> None:
        """Finalizes what a failed test left, so the next one starts with no file."""
        for ctx in list(self.contexts):
            self.finalize(ctx)
        self.real_clock()

    def _start(self, ctx: int, descr: Any) -> int:
        # NCCL's descriptors live on its stack: their padding holds whatever was there.
        at = ctypes.addressof(descr)
        ctypes.memset(at + 20, 0xAA, 4)  # after rank
        if self.version == 4:
            ctypes.memset(at + 1, 0xAA, 7)  # after the one-byte type
        handle = ctypes.c_void_p()
        assert self.api.startEvent(ctx, ctypes.byref(handle), ctypes.byref(descr)) == 0
        return handle.value or 0

    def start_coll(
        self,
        ctx: int,
        seq: int,
        func: str = "AllReduce",
        count: int = 1024,
        datatype: str = "ncclFloat32",
        nchannels: int = 2,
        rank: int = 0,
    ) -> int:
        d = self.descr(type=NCCL_PROFILE_COLL, rank=rank)
        d.coll.seqNumber = seq
        self._keep = [func.encode(), datatype.encode(), b"Ring", b"Simple"]
        d.coll.func, d.coll.datatype, d.coll.algo, d.coll.proto = self._keep
        d.coll.count = count
        d.coll.nChannels = nchannels
        d.coll.nWarps = 16
        return self._start(ctx, d)

    def start_p2p(
        self, ctx: int, func: str, peer: int, count: int, datatype: str = "ncclFloat16"
    ) -> int:
        d = self.descr(type=NCCL_PROFILE_P2P)
        self._keep = [func.encode(), datatype.encode()]
        d.p2p.func, d.p2p.datatype = self._keep
        d.p2p.count = count
        d.p2p.peer = peer
        d.p2p.nChannels = 1
        return self._start(ctx, d)

    def start_kernel_ch(self, ctx: int, parent: int, channel: int, gpu_start_ns: int) -> int:
        d = self.descr(type=NCCL_PROFILE_KERNEL_CH, parentObj=parent)
        d.kernelCh.channelId = channel
        d.kernelCh.pTimer = gpu_start_ns
        return self._start(ctx, d)

    def start_proxy_op(
        self, ctx: int, parent: int, channel: int, is_send: bool, pid: int | None = None
    ) -> int:
        d = self.descr(type=NCCL_PROFILE_PROXY_OP, parentObj=parent)
        d.proxyOp.pid = os.getpid() if pid is None else pid
        d.proxyOp.channelId = channel
        d.proxyOp.peer = 1
        d.proxyOp.nSteps = 1
        d.proxyOp.chunkSize = 2048
        d.proxyOp.isSend = int(is_send)
        return self._start(ctx, d)

    def start_proxy_step(self, ctx: int, op: int, step: int) -> int:
        d = self.descr(type=NCCL_PROFILE_PROXY_STEP, parentObj=op)
        d.proxyStep.step = step
        return self._start(ctx, d)

    def start_group(self, ctx: int) -> int:
        return self._start(ctx, self.descr(type=NCCL_PROFILE_GROUP))

    def state(self, handle: int, state: int, trans_size: int = 0, p_timer: int = 0) -> None:
        args = StateArgs()
        if p_timer:
            args.pTimer = p_timer
        else:
            args.transSize = trans_size
        assert self.api.recordEventState(handle, state, ctypes.byref(args)) == 0

    def stop(self, handle: int) -> None:
        assert self.api.stopEvent(handle) == 0
