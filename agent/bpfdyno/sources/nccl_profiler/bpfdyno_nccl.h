/* The shared-memory file the plugin writes and the agent reads (receiver.py decodes the same
 * layout; keep the two in step and bump BPFDYNO_NCCL_LAYOUT on any change).
 *
 * One file per trainer process, <dir>/bpfdyno-nccl.<pid> (dir: BPFDYNO_NCCL_SHM_DIR, default
 * /dev/shm), mode 0600, owned by the trainer's user:
 *   header (256 B) | comm slots (8 x 192 B) | record ring (4096 x 80 B)
 * Comm slots hold cumulative per-communicator aggregates behind a sequence lock (gen odd while
 * a writer is inside). The ring holds one record per completed collective / point-to-point
 * (and an update record when parts that started late end) always, and one per kernel channel
 * and proxy step while the agent asks for detail (full mode: header.detail_until_ns in the
 * future on CLOCK_MONOTONIC). A record is valid when its commit
 * field equals its ring index + 1. All times are CLOCK_MONOTONIC ns, except the GPU's
 * globaltimer values (gpu_start_ns, gpu_stop_ns). */
#ifndef BPFDYNO_NCCL_H
#define BPFDYNO_NCCL_H

#include <stdint.h>

#define BPFDYNO_NCCL_MAGIC 0x4c43434e44465042ULL /* "BPFDNCCL" little-endian */
#define BPFDYNO_NCCL_LAYOUT 1
#define BPFDYNO_NCCL_COMM_SLOTS 8
#define BPFDYNO_NCCL_RING_RECORDS 4096

enum bpfdyno_nccl_kind {
  BPFDYNO_REC_COLL = 1,
  BPFDYNO_REC_P2P = 2,
  BPFDYNO_REC_KERNEL_CH = 3,
  BPFDYNO_REC_PROXY_STEP = 4,
  /* A published collective / point-to-point operation's new values, after parts that
   * started late ended (the aggregates got the growth). */
  BPFDYNO_REC_COLL_UPDATE = 5,
  BPFDYNO_REC_P2P_UPDATE = 6,
};

enum bpfdyno_nccl_func {
  BPFDYNO_FUNC_OTHER = 0,
  BPFDYNO_FUNC_ALL_REDUCE = 1,
  BPFDYNO_FUNC_ALL_GATHER = 2,
  BPFDYNO_FUNC_REDUCE_SCATTER = 3,
  BPFDYNO_FUNC_BROADCAST = 4,
  BPFDYNO_FUNC_REDUCE = 5,
  BPFDYNO_FUNC_SEND = 6,
  BPFDYNO_FUNC_RECV = 7,
};

struct bpfdyno_nccl_header {
  uint64_t magic;
  uint32_t layout;
  uint32_t header_bytes;
  uint32_t pid;             /* getpid() of the trainer, as its own namespace sees it */
  uint32_t comm_slots;
  uint32_t ring_records;
  uint32_t record_bytes;
  uint64_t start_ticks;     /* the process's start time (/proc/self/stat field 22) */
  int64_t realtime_offset_ns; /* CLOCK_REALTIME - CLOCK_MONOTONIC, as last measured */
  uint64_t detail_until_ns; /* written by the agent: full mode until this monotonic time */
  uint64_t ring_head;       /* records claimed so far (next index) */
  uint32_t comms_dropped;   /* communicators beyond the slots: not counted */
  uint32_t api_version;     /* the NCCL profiler API version in use (5) */
  uint32_t activation_mask; /* the event types asked of NCCL */
  uint32_t colls_dropped;   /* collectives not profiled: their communicator's pool was full */
  uint64_t offset_measured_ns; /* when realtime_offset_ns was measured */
  uint8_t reserved[168];
};

struct bpfdyno_nccl_comm {
  uint64_t gen;
  uint64_t comm_id;
  int32_t rank;
  int32_t nranks;
  int32_t nnodes;
  uint32_t state; /* 0 free, 1 live, 2 finalized */
  char name[32];
  uint64_t colls_started;
  uint64_t last_seq_started;
  uint64_t colls_completed;
  uint64_t last_seq_completed;
  uint64_t coll_ns_total;     /* start on the CPU -> last part (kernel channel, proxy op) done */
  uint64_t gpu_ns_total;      /* first kernel channel start -> last channel stop, GPU clock */
  uint64_t net_wait_ns_total; /* proxy steps waiting on the peer / network */
  uint64_t bytes_total;
  uint64_t last_start_ns;     /* when the latest collective started on the CPU */
  uint64_t last_done_ns;      /* when the latest collective completed */
  uint64_t p2p_completed;
  uint64_t p2p_ns_total;
  uint8_t reserved[32];
};

struct bpfdyno_nccl_record {
  uint64_t commit; /* ring index + 1 once the record is complete */
  uint8_t kind;    /* enum bpfdyno_nccl_kind */
  uint8_t comm_slot;
  uint8_t func;    /* enum bpfdyno_nccl_func; a proxy step: the wait state it recorded */
  uint8_t channel;
  uint32_t extra;  /* coll: nChannels; p2p: peer; proxy step: step number */
  uint64_t seq;    /* the collective's sequence number (a part: its collective's) */
  uint64_t start_ns;
  uint64_t duration_ns;
  uint64_t gpu_start_ns;
  uint64_t gpu_stop_ns;
  uint64_t net_wait_ns;
  uint64_t bytes;
  uint64_t enqueue_ns; /* coll/p2p: start -> NCCL's stopEvent (the CPU-side enqueue) */
};

_Static_assert(sizeof(struct bpfdyno_nccl_header) == 256, "header size");
_Static_assert(sizeof(struct bpfdyno_nccl_comm) == 192, "comm slot size");
_Static_assert(sizeof(struct bpfdyno_nccl_record) == 80, "record size");

#endif
