/* NCCL's profiler plugin ABI, API v5 (and v4), declared from its documented
 * layout. Only what this plugin uses is named; the union members keep every field so that
 * the descriptor's size and offsets match what NCCL passes. The offsets are pinned by the
 * _Static_asserts at the end (x86_64 and aarch64, LP64). */
#ifndef BPFDYNO_NCCL_PROFILER_ABI_H
#define BPFDYNO_NCCL_PROFILER_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef enum {
  ncclSuccess = 0,
  ncclSystemError = 2,
  ncclInternalError = 3,
} ncclResult_t;

/* NCCL's logger: level (2 = warning, 3 = info), subsystem flags, file, line, format. */
typedef void (*ncclDebugLogger_t)(int level, unsigned long flags, const char* file, int line,
                                  const char* fmt, ...);

/* Event types (bit flags; the activation mask is their OR). */
enum {
  ncclProfileGroup = 1 << 0,
  ncclProfileColl = 1 << 1,
  ncclProfileP2p = 1 << 2,
  ncclProfileProxyOp = 1 << 3,
  ncclProfileProxyStep = 1 << 4,
  ncclProfileProxyCtrl = 1 << 5,
  ncclProfileKernelCh = 1 << 6,
  ncclProfileNetPlugin = 1 << 7,
  ncclProfileGroupApi = 1 << 8,
  ncclProfileCollApi = 1 << 9,
  ncclProfileP2pApi = 1 << 10,
  ncclProfileKernelLaunch = 1 << 11,
};

/* Event state transitions this plugin acts on (values fixed by the ABI). */
typedef enum {
  ncclProfilerProxyStepSendGPUWait = 8,
  ncclProfilerProxyStepSendWait = 9,
  ncclProfilerProxyStepRecvWait = 10,
  ncclProfilerProxyStepRecvFlushWait = 11,
  ncclProfilerProxyStepRecvGPUWait = 12,
  ncclProfilerProxyStepSendPeerWait_v4 = 20,
  ncclProfilerKernelChStop = 22,
} ncclProfilerEventState_v5_t;

typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      bool graphCaptured;
      int groupDepth;
    } groupApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
    } collApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
    } p2pApi;
    struct {
      void* stream;
    } kernelLaunch;
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
      void* parentGroup;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void* parentGroup;
    } p2p;
    struct {
      pid_t pid;
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
      uint64_t pTimer; /* GPU globaltimer at the channel's start, ns */
    } kernelCh;
    struct {
      int64_t id;
      void* data;
    } netPlugin;
  };
} ncclProfilerEventDescr_v5_t;

typedef union {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    uint64_t pTimer; /* GPU globaltimer at the channel's stop, ns */
  } kernelCh;
} ncclProfilerEventStateArgs_v5_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask,
                       const char* commName, int nNodes, int nranks, int rank,
                       ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v5_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v5_t eState,
                                   ncclProfilerEventStateArgs_v5_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v5_t;

/* API v4 (the NCCL releases before v5): the same union members at the same offsets, without
 * the API events and parentGroup; a one-byte type; init takes the communicator's name first. */
typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
    } p2p;
    struct {
      pid_t pid;
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
      uint64_t pTimer;
    } kernelCh;
    struct {
      int64_t id;
      void* data;
    } netPlugin;
  };
} ncclProfilerEventDescr_v4_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, int* eActivationMask, const char* commName,
                       uint64_t commHash, int nNodes, int nranks, int rank,
                       ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v4_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v5_t eState,
                                   ncclProfilerEventStateArgs_v5_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v4_t;

/* The layout NCCL's own header gives on LP64 targets. */
_Static_assert(sizeof(ncclProfilerEventDescr_v5_t) == 112, "v5 descriptor size");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, rank) == 16, "rank");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, coll.seqNumber) == 24, "coll.seqNumber");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, coll.count) == 56, "coll.count");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, coll.datatype) == 72, "coll.datatype");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, coll.nChannels) == 80, "coll.nChannels");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, coll.algo) == 88, "coll.algo");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, coll.parentGroup) == 104, "coll.parent");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, p2p.count) == 48, "p2p.count");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, p2p.peer) == 56, "p2p.peer");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, proxyOp.channelId) == 28, "proxyOp.ch");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, proxyOp.isSend) == 44, "proxyOp.isSend");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, kernelCh.pTimer) == 32, "kernelCh.pTimer");
_Static_assert(sizeof(ncclProfilerEventStateArgs_v5_t) == 8, "v5 state args size");
_Static_assert(sizeof(ncclProfiler_v5_t) == 48, "v5 function table size");
_Static_assert(sizeof(ncclProfilerEventDescr_v4_t) == 104, "v4 descriptor size");
_Static_assert(offsetof(ncclProfilerEventDescr_v4_t, coll.seqNumber) == 24, "v4 coll.seqNumber");
_Static_assert(offsetof(ncclProfilerEventDescr_v4_t, coll.proto) == 96, "v4 coll.proto");
_Static_assert(offsetof(ncclProfilerEventDescr_v4_t, p2p.peer) == 56, "v4 p2p.peer");
_Static_assert(offsetof(ncclProfilerEventDescr_v4_t, proxyOp.isSend) == 44, "v4 proxyOp.isSend");
_Static_assert(offsetof(ncclProfilerEventDescr_v4_t, kernelCh.pTimer) == 32, "v4 kernelCh");

#endif
