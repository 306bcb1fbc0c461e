/* bpfdyno's NCCL profiler plugin (NCCL_PROFILER_PLUGIN=/path/libbpfdyno-nccl-profiler.so).
 *
 * NCCL calls it for every collective, point-to-point, proxy operation/step and kernel channel
 * of each communicator. It keeps per-communicator aggregates and a ring of per-collective
 * records in one shared-memory file per process (layout: bpfdyno_nccl.h), which the agent reads
 * with pread: nothing here makes a system call per event, and nothing waits for the agent.
 *
 * Lifetimes: NCCL stops a collective's own event once it is enqueued, and its kernel channels
 * and proxy operations run on after that — and may even start after it, as NCCL's proxy thread
 * picks them up. So a collective is reference-counted (one reference for itself, one per live
 * part) and lives in a per-communicator pool, never freed while the communicator lives: a part
 * that starts late still finds it. Each time its count drops to zero it is settled: the first
 * time it is published (counted, a record), a later time (late parts done) the growth of its
 * duration, GPU span and network wait is added to the aggregates and an update record carries
 * its new values. A pool entry is reused, oldest first, only once settled.
 *
 * Errors never reach NCCL from the event calls (they return ncclSuccess whatever happens, as
 * NCCL asks of plugins); init fails, which makes NCCL run without the plugin, only when the
 * shared-memory file cannot be made. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bpfdyno_nccl.h"
#include "nccl_profiler_abi.h"

#define EXPORT __attribute__((visibility("default")))

/* A test harness may replace the clock to get exact durations (NULL: CLOCK_MONOTONIC). */
EXPORT uint64_t (*bpfdyno_nccl_clock)(void) = NULL;

static inline uint64_t now_ns(void) {
  if (__builtin_expect(bpfdyno_nccl_clock != NULL, 0)) return bpfdyno_nccl_clock();
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* What NCCL is asked for unless BPFDYNO_NCCL_EVENTS (an activation mask) says otherwise. */
#define DEFAULT_MASK \
  (ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | ncclProfileProxyStep | \
   ncclProfileKernelCh)

enum ev_kind { EV_COLL = 1, EV_KERNEL_CH, EV_PROXY_OP, EV_PROXY_STEP };

struct comm_ctx;

struct coll_ev {
  int kind; /* EV_COLL (collective or point-to-point) */
  struct comm_ctx* comm;
  uint8_t is_p2p;
  uint8_t func;
  uint8_t nchannels;
  uint32_t peer;
  uint64_t seq;
  uint64_t bytes;
  uint64_t start_ns;
  uint64_t enqueue_ns;
  uint32_t refs;          /* atomic; 0: settled (free for reuse) */
  uint64_t gpu_start_ns;  /* atomic min over kernel channels (0: none yet) */
  uint64_t gpu_stop_ns;   /* atomic max */
  uint64_t net_wait_ns;   /* atomic sum over proxy steps */
  /* What was published so far (under the communicator's lock). */
  uint8_t published;
  uint64_t pub_end_ns;
  uint64_t pub_gpu_ns;
  uint64_t pub_wait_ns;
};

/* Collectives in flight per communicator, at most (more are not profiled, and counted). */
#define COLL_POOL 256

struct kernel_ch_ev {
  int kind; /* EV_KERNEL_CH */
  struct coll_ev* coll;
  uint8_t channel;
  uint64_t start_ns;
  uint64_t gpu_start_ns;
  uint64_t gpu_stop_ns;
};

struct proxy_op_ev {
  int kind; /* EV_PROXY_OP */
  struct coll_ev* coll; /* NULL when the operation belongs to another process */
  uint8_t channel;
};

struct proxy_step_ev {
  int kind; /* EV_PROXY_STEP */
  struct coll_ev* coll;
  struct comm_ctx* comm;
  uint8_t channel;
  int step;
  uint64_t start_ns;
  int state;         /* the last state recorded (0: none) */
  uint64_t state_ns; /* when it was entered */
  uint64_t wait_ns;  /* time in the states that wait on the peer or the network */
  uint64_t bytes;
};

struct comm_ctx {
  int slot; /* index into the comm slots; -1 when they were all taken */
  pthread_mutex_t lock;
  uint32_t next; /* where the pool's search for a settled entry starts */
  struct coll_ev pool[COLL_POOL];
};

/* The process's one file, shared by all communicators. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct bpfdyno_nccl_header* g_hdr;
static struct bpfdyno_nccl_comm* g_comms;
static struct bpfdyno_nccl_record* g_ring;
static size_t g_bytes;
static int g_live_comms;
static pid_t g_pid; /* the process that made the file */
static char g_path[PATH_MAX];
static int g_mask = DEFAULT_MASK;

static uint8_t func_id(const char* f) {
  if (f == NULL) return BPFDYNO_FUNC_OTHER;
  if (strcmp(f, "AllReduce") == 0) return BPFDYNO_FUNC_ALL_REDUCE;
  if (strcmp(f, "AllGather") == 0) return BPFDYNO_FUNC_ALL_GATHER;
  if (strcmp(f, "ReduceScatter") == 0) return BPFDYNO_FUNC_REDUCE_SCATTER;
  if (strcmp(f, "Broadcast") == 0) return BPFDYNO_FUNC_BROADCAST;
  if (strcmp(f, "Reduce") == 0) return BPFDYNO_FUNC_REDUCE;
  if (strcmp(f, "Send") == 0) return BPFDYNO_FUNC_SEND;
  if (strcmp(f, "Recv") == 0) return BPFDYNO_FUNC_RECV;
  return BPFDYNO_FUNC_OTHER;
}

/* Bytes per element of NCCL's datatype names (ncclFloat32, ...); 0 when unknown. */
static uint64_t datatype_bytes(const char* t) {
  if (t == NULL || strncmp(t, "nccl", 4) != 0) return 0;
  t += 4;
  if (strncmp(t, "Float8", 6) == 0) return 1;
  size_t n = strlen(t);
  if (n >= 2 && strcmp(t + n - 2, "16") == 0) return 2;
  if (n >= 2 && strcmp(t + n - 2, "32") == 0) return 4;
  if (n >= 2 && strcmp(t + n - 2, "64") == 0) return 8;
  if (n >= 1 && t[n - 1] == '8') return 1;
  return 0;
}

static uint64_t process_start_ticks(void) {
  char buf[1024];
  int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  /* Fields after the command name, which may hold spaces: start after the last ')'. */
  char* p = strrchr(buf, ')');
  if (p == NULL) return 0;
  int field = 2;
  for (; *p && field < 22; p++)
    if (*p == ' ') field++;
  return strtoull(p, NULL, 10);
}

/* CLOCK_REALTIME - CLOCK_MONOTONIC, which the agent adds to the records' times to compare
 * ranks across nodes. NTP slews the real-time clock (up to 500 ppm), so it is measured again
 * every second of collectives (see plugin_start_event), not only when the file is made. */
static void refresh_realtime_offset(void) {
  struct timespec rt, mono;
  clock_gettime(CLOCK_REALTIME, &rt);
  clock_gettime(CLOCK_MONOTONIC, &mono);
  int64_t offset = ((int64_t)rt.tv_sec - (int64_t)mono.tv_sec) * 1000000000LL +
                   ((int64_t)rt.tv_nsec - (int64_t)mono.tv_nsec);
  __atomic_store_n(&g_hdr->realtime_offset_ns, offset, __ATOMIC_RELAXED);
  __atomic_store_n(&g_hdr->offset_measured_ns, now_ns(), __ATOMIC_RELAXED);
}

static int map_file(ncclDebugLogger_t logfn) {
  const char* dir = getenv("BPFDYNO_NCCL_SHM_DIR");
  if (dir == NULL || dir[0] == 0) dir = "/dev/shm";
  const char* mask = getenv("BPFDYNO_NCCL_EVENTS");
  g_mask = DEFAULT_MASK;
  if (mask != NULL && mask[0] != 0) g_mask = (int)strtol(mask, NULL, 0);
  snprintf(g_path, sizeof(g_path), "%s/bpfdyno-nccl.%d", dir, (int)getpid());
  g_bytes = sizeof(struct bpfdyno_nccl_header) +
            BPFDYNO_NCCL_COMM_SLOTS * sizeof(struct bpfdyno_nccl_comm) +
            BPFDYNO_NCCL_RING_RECORDS * sizeof(struct bpfdyno_nccl_record);
  /* A file left by an earlier process with the same pid is stale: replace it. */
  unlink(g_path);
  int fd = open(g_path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)g_bytes) != 0) {
    int err = errno;
    if (fd >= 0) close(fd);
    if (logfn)
      logfn(2, 1, __FILE__, __LINE__,
            "bpfdyno NCCL profiler: cannot create %s: %s; set BPFDYNO_NCCL_SHM_DIR to a "
            "writable directory the bpfdyno agent reads (its nccl_profiler.shm_dir)",
            g_path, strerror(err));
    return -1;
  }
  void* mem = mmap(NULL, g_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (mem == MAP_FAILED) {
    unlink(g_path);
    return -1;
  }
  g_hdr = mem;
  g_comms = (struct bpfdyno_nccl_comm*)((char*)mem + sizeof(*g_hdr));
  g_ring = (struct bpfdyno_nccl_record*)(g_comms + BPFDYNO_NCCL_COMM_SLOTS);
  g_hdr->layout = BPFDYNO_NCCL_LAYOUT;
  g_hdr->header_bytes = sizeof(*g_hdr);
  g_pid = getpid();
  g_hdr->pid = (uint32_t)g_pid;
  g_hdr->comm_slots = BPFDYNO_NCCL_COMM_SLOTS;
  g_hdr->ring_records = BPFDYNO_NCCL_RING_RECORDS;
  g_hdr->record_bytes = sizeof(struct bpfdyno_nccl_record);
  g_hdr->start_ticks = process_start_ticks();
  refresh_realtime_offset();
  g_hdr->activation_mask = (uint32_t)g_mask;
  /* The magic last: the agent ignores a file until it is set. */
  __atomic_store_n(&g_hdr->magic, BPFDYNO_NCCL_MAGIC, __ATOMIC_RELEASE);
  return 0;
}

static int detail_wanted(uint64_t now) {
  uint64_t until = __atomic_load_n(&g_hdr->detail_until_ns, __ATOMIC_RELAXED);
  return until != 0 && now < until;
}

/* Claims a ring slot, lets fill() write it, then commits it. */
static struct bpfdyno_nccl_record* ring_claim(uint64_t* index) {
  *index = __atomic_fetch_add(&g_hdr->ring_head, 1, __ATOMIC_RELAXED);
  struct bpfdyno_nccl_record* r = &g_ring[*index % BPFDYNO_NCCL_RING_RECORDS];
  __atomic_store_n(&r->commit, 0, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  return r;
}

static void ring_commit(struct bpfdyno_nccl_record* r, uint64_t index) {
  __atomic_store_n(&r->commit, index + 1, __ATOMIC_RELEASE);
}

/* A comm slot's writers hold their communicator's lock; the agent reads without one, so the
 * slot's generation is odd while a writer is inside. */
static void slot_write_begin(struct bpfdyno_nccl_comm* s) {
  __atomic_store_n(&s->gen, s->gen + 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
}

static void slot_write_end(struct bpfdyno_nccl_comm* s) {
  __atomic_store_n(&s->gen, s->gen + 1, __ATOMIC_RELEASE);
}

/* Publishes e, or its growth since it was published (see the top of the file). */
static void coll_settle(struct coll_ev* e) {
  struct comm_ctx* c = e->comm;
  uint64_t done = now_ns();
  pthread_mutex_lock(&c->lock);
  uint64_t gpu_start = __atomic_load_n(&e->gpu_start_ns, __ATOMIC_ACQUIRE);
  uint64_t gpu_stop = __atomic_load_n(&e->gpu_stop_ns, __ATOMIC_ACQUIRE);
  uint64_t gpu_ns = (gpu_start != 0 && gpu_stop > gpu_start) ? gpu_stop - gpu_start : 0;
  uint64_t wait_ns = __atomic_load_n(&e->net_wait_ns, __ATOMIC_ACQUIRE);
  uint64_t end = e->published && e->pub_end_ns > done ? e->pub_end_ns : done;
  uint64_t dur = end > e->start_ns ? end - e->start_ns : 0;
  uint64_t add_dur = e->published ? end - e->pub_end_ns : dur;
  uint64_t add_gpu = e->published && gpu_ns > e->pub_gpu_ns ? gpu_ns - e->pub_gpu_ns : 0;
  uint64_t add_wait = e->published && wait_ns > e->pub_wait_ns ? wait_ns - e->pub_wait_ns : 0;
  if (!e->published) {
    add_gpu = gpu_ns;
    add_wait = wait_ns;
  }
  if (c->slot >= 0) {
    struct bpfdyno_nccl_comm* s = &g_comms[c->slot];
    slot_write_begin(s);
    if (e->is_p2p) {
      s->p2p_completed += !e->published;
      s->p2p_ns_total += add_dur;
    } else {
      if (!e->published) {
        s->colls_completed++;
        s->last_seq_completed = e->seq;
      }
      s->coll_ns_total += add_dur;
      s->gpu_ns_total += add_gpu;
    }
    s->net_wait_ns_total += add_wait;
    if (!e->published) s->bytes_total += e->bytes;
    s->last_done_ns = end;
    slot_write_end(s);
  }
  uint64_t index;
  struct bpfdyno_nccl_record* r = ring_claim(&index);
  if (e->is_p2p)
    r->kind = e->published ? BPFDYNO_REC_P2P_UPDATE : BPFDYNO_REC_P2P;
  else
    r->kind = e->published ? BPFDYNO_REC_COLL_UPDATE : BPFDYNO_REC_COLL;
  r->comm_slot = (uint8_t)(c->slot < 0 ? 0xff : c->slot);
  r->func = e->func;
  r->channel = 0;
  r->extra = e->is_p2p ? e->peer : e->nchannels;
  r->seq = e->seq;
  r->start_ns = e->start_ns;
  r->duration_ns = dur;
  r->gpu_start_ns = gpu_start;
  r->gpu_stop_ns = gpu_stop;
  r->net_wait_ns = wait_ns;
  r->bytes = e->bytes;
  r->enqueue_ns = e->enqueue_ns;
  ring_commit(r, index);
  e->published = 1;
  e->pub_end_ns = end;
  e->pub_gpu_ns = gpu_ns;
  e->pub_wait_ns = wait_ns;
  pthread_mutex_unlock(&c->lock);
}

static void coll_unref(struct coll_ev* e) {
  if (__atomic_sub_fetch(&e->refs, 1, __ATOMIC_ACQ_REL) == 0) coll_settle(e);
}

/* A settled pool entry for a new collective (NULL when all are in flight); under c->lock. */
static struct coll_ev* coll_alloc(struct comm_ctx* c) {
  for (uint32_t k = 0; k < COLL_POOL; k++) {
    struct coll_ev* e = &c->pool[(c->next + k) % COLL_POOL];
    if (__atomic_load_n(&e->refs, __ATOMIC_ACQUIRE) == 0) {
      c->next = (c->next + k + 1) % COLL_POOL;
      memset(e, 0, sizeof(*e));
      e->kind = EV_COLL;
      e->comm = c;
      __atomic_store_n(&e->refs, 1, __ATOMIC_RELEASE);
      return e;
    }
  }
  return NULL;
}

static void coll_ref(struct coll_ev* e) { __atomic_add_fetch(&e->refs, 1, __ATOMIC_RELAXED); }

static ncclResult_t init_comm(void** context, uint64_t commId, int* eActivationMask,
                              const char* commName, int nNodes, int nranks, int rank,
                              ncclDebugLogger_t logfn, uint32_t api_version) {
  *context = NULL;
  pthread_mutex_lock(&g_lock);
  if (g_hdr != NULL && g_pid != getpid()) {
    /* A child forked after its parent's NCCL started: the mapping is the parent's file. The
     * child's communicators get a file of their own; the parent's are not the child's. */
    munmap(g_hdr, g_bytes);
    g_hdr = NULL;
    g_live_comms = 0;
  }
  if (g_hdr == NULL && map_file(logfn) != 0) {
    pthread_mutex_unlock(&g_lock);
    return ncclSystemError;
  }
  g_hdr->api_version = api_version;
  struct comm_ctx* c = calloc(1, sizeof(*c));
  if (c == NULL) {
    pthread_mutex_unlock(&g_lock);
    return ncclSystemError;
  }
  pthread_mutex_init(&c->lock, NULL);
  c->slot = -1;
  for (int i = 0; i < BPFDYNO_NCCL_COMM_SLOTS; i++) {
    if (g_comms[i].state == 1) continue;
    /* A finalized communicator's slot is reused only when no free one is left. */
    if (g_comms[i].state == 2) {
      int free_left = 0;
      for (int j = i + 1; j < BPFDYNO_NCCL_COMM_SLOTS; j++) free_left |= g_comms[j].state == 0;
      if (free_left) continue;
    }
    c->slot = i;
    break;
  }
  if (c->slot < 0) {
    g_hdr->comms_dropped++;
  } else {
    struct bpfdyno_nccl_comm* s = &g_comms[c->slot];
    pthread_mutex_lock(&c->lock);
    slot_write_begin(s);
    uint64_t gen = s->gen;
    memset((char*)s + sizeof(s->gen), 0, sizeof(*s) - sizeof(s->gen));
    s->gen = gen;
    s->comm_id = commId;
    s->rank = rank;
    s->nranks = nranks;
    s->nnodes = nNodes;
    s->state = 1;
    snprintf(s->name, sizeof(s->name), "%s", commName ? commName : "");
    slot_write_end(s);
    pthread_mutex_unlock(&c->lock);
  }
  g_live_comms++;
  pthread_mutex_unlock(&g_lock);
  *eActivationMask = g_mask;
  *context = c;
  return ncclSuccess;
}

static ncclResult_t plugin_init(void** context, uint64_t commId, int* eActivationMask,
                                const char* commName, int nNodes, int nranks, int rank,
                                ncclDebugLogger_t logfn) {
  return init_comm(context, commId, eActivationMask, commName, nNodes, nranks, rank, logfn, 5);
}

static ncclResult_t plugin_init_v4(void** context, int* eActivationMask, const char* commName,
                                   uint64_t commHash, int nNodes, int nranks, int rank,
                                   ncclDebugLogger_t logfn) {
  return init_comm(context, commHash, eActivationMask, commName, nNodes, nranks, rank, logfn, 4);
}

static ncclResult_t plugin_start_event(void* context, void** eHandle,
                                       ncclProfilerEventDescr_v5_t* d) {
  *eHandle = NULL;
  struct comm_ctx* c = context;
  if (c == NULL || d == NULL) return ncclSuccess;
  switch (d->type) {
    case ncclProfileColl:
    case ncclProfileP2p: {
      uint64_t start = now_ns();
      pthread_mutex_lock(&c->lock);
      struct coll_ev* e = coll_alloc(c);
      if (e == NULL) {
        __atomic_add_fetch(&g_hdr->colls_dropped, 1, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&c->lock);
        return ncclSuccess;
      }
      e->start_ns = start;
      if (start - __atomic_load_n(&g_hdr->offset_measured_ns, __ATOMIC_RELAXED) > 1000000000ULL)
        refresh_realtime_offset();
      if (d->type == ncclProfileColl) {
        e->seq = d->coll.seqNumber;
        e->func = func_id(d->coll.func);
        e->nchannels = d->coll.nChannels;
        e->bytes = (uint64_t)d->coll.count * datatype_bytes(d->coll.datatype);
        if (c->slot >= 0) {
          struct bpfdyno_nccl_comm* s = &g_comms[c->slot];
          slot_write_begin(s);
          s->colls_started++;
          s->last_seq_started = e->seq;
          s->last_start_ns = e->start_ns;
          slot_write_end(s);
        }
        pthread_mutex_unlock(&c->lock);
      } else {
        pthread_mutex_unlock(&c->lock);
        e->is_p2p = 1;
        e->func = func_id(d->p2p.func);
        e->nchannels = d->p2p.nChannels;
        e->peer = (uint32_t)d->p2p.peer;
        e->bytes = (uint64_t)d->p2p.count * datatype_bytes(d->p2p.datatype);
      }
      *eHandle = e;
      return ncclSuccess;
    }
    case ncclProfileKernelCh: {
      struct coll_ev* parent = d->parentObj;
      if (parent == NULL || parent->kind != EV_COLL) return ncclSuccess;
      struct kernel_ch_ev* e = calloc(1, sizeof(*e));
      if (e == NULL) return ncclSuccess;
      e->kind = EV_KERNEL_CH;
      e->coll = parent;
      e->channel = d->kernelCh.channelId;
      e->start_ns = now_ns();
      e->gpu_start_ns = d->kernelCh.pTimer;
      coll_ref(parent);
      *eHandle = e;
      return ncclSuccess;
    }
    case ncclProfileProxyOp: {
      struct proxy_op_ev* e = calloc(1, sizeof(*e));
      if (e == NULL) return ncclSuccess;
      e->kind = EV_PROXY_OP;
      e->channel = d->proxyOp.channelId;
      /* The parent is this process's event only when the operation was posted here. */
      struct coll_ev* parent = d->parentObj;
      if (d->proxyOp.pid == getpid() && parent != NULL && parent->kind == EV_COLL) {
        e->coll = parent;
        coll_ref(parent);
      }
      *eHandle = e;
      return ncclSuccess;
    }
    case ncclProfileProxyStep: {
      struct proxy_op_ev* op = d->parentObj;
      if (op == NULL || op->kind != EV_PROXY_OP) return ncclSuccess;
      struct proxy_step_ev* e = calloc(1, sizeof(*e));
      if (e == NULL) return ncclSuccess;
      e->kind = EV_PROXY_STEP;
      e->comm = c;
      e->coll = op->coll;
      e->channel = op->channel;
      e->step = d->proxyStep.step;
      e->start_ns = now_ns();
      e->state_ns = e->start_ns;
      if (e->coll != NULL) coll_ref(e->coll);
      *eHandle = e;
      return ncclSuccess;
    }
    default:
      return ncclSuccess;
  }
}

/* v4's descriptor holds v5's union members at the same offsets: copy it into a v5 one. */
static ncclResult_t plugin_start_event_v4(void* context, void** eHandle,
                                          ncclProfilerEventDescr_v4_t* d4) {
  *eHandle = NULL;
  if (d4 == NULL) return ncclSuccess;
  ncclProfilerEventDescr_v5_t d5;
  memset(&d5, 0, sizeof(d5));
  d5.type = d4->type;
  d5.parentObj = d4->parentObj;
  d5.rank = d4->rank;
  memcpy(&d5.coll, &d4->coll, sizeof(*d4) - offsetof(ncclProfilerEventDescr_v4_t, coll));
  return plugin_start_event(context, eHandle, &d5);
}

static int waits_on_network(int state) {
  return state == ncclProfilerProxyStepSendPeerWait_v4 || state == ncclProfilerProxyStepSendWait ||
         state == ncclProfilerProxyStepRecvWait;
}

static void step_close_state(struct proxy_step_ev* e, uint64_t now) {
  if (waits_on_network(e->state) && now > e->state_ns) e->wait_ns += now - e->state_ns;
}

static void write_part_record(uint8_t kind, struct comm_ctx* c, struct coll_ev* coll,
                              uint8_t func, uint8_t channel, uint32_t extra, uint64_t start,
                              uint64_t dur, uint64_t gpu_start, uint64_t gpu_stop,
                              uint64_t wait, uint64_t bytes) {
  uint64_t index;
  struct bpfdyno_nccl_record* r = ring_claim(&index);
  r->kind = kind;
  r->comm_slot = (uint8_t)(c == NULL || c->slot < 0 ? 0xff : c->slot);
  r->func = func;
  r->channel = channel;
  r->extra = extra;
  r->seq = coll ? coll->seq : 0;
  r->start_ns = start;
  r->duration_ns = dur;
  r->gpu_start_ns = gpu_start;
  r->gpu_stop_ns = gpu_stop;
  r->net_wait_ns = wait;
  r->bytes = bytes;
  r->enqueue_ns = 0;
  ring_commit(r, index);
}

static void atomic_min_nonzero(uint64_t* p, uint64_t v) {
  uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
  while ((cur == 0 || v < cur) &&
         !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
  }
}

static void atomic_max(uint64_t* p, uint64_t v) {
  uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (v > cur &&
         !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
  }
}

static ncclResult_t plugin_stop_event(void* handle) {
  if (handle == NULL) return ncclSuccess;
  switch (*(int*)handle) {
    case EV_COLL: {
      struct coll_ev* e = handle;
      uint64_t now = now_ns();
      e->enqueue_ns = now > e->start_ns ? now - e->start_ns : 0;
      coll_unref(e);
      break;
    }
    case EV_KERNEL_CH: {
      struct kernel_ch_ev* e = handle;
      struct coll_ev* coll = e->coll;
      if (e->gpu_start_ns != 0) atomic_min_nonzero(&coll->gpu_start_ns, e->gpu_start_ns);
      if (e->gpu_stop_ns != 0) atomic_max(&coll->gpu_stop_ns, e->gpu_stop_ns);
      uint64_t now = now_ns();
      if (detail_wanted(now))
        write_part_record(BPFDYNO_REC_KERNEL_CH, coll->comm, coll, coll->func, e->channel, 0,
                          e->start_ns, now - e->start_ns, e->gpu_start_ns, e->gpu_stop_ns, 0, 0);
      coll_unref(coll);
      free(e);
      break;
    }
    case EV_PROXY_OP: {
      struct proxy_op_ev* e = handle;
      if (e->coll != NULL) coll_unref(e->coll);
      free(e);
      break;
    }
    case EV_PROXY_STEP: {
      struct proxy_step_ev* e = handle;
      uint64_t now = now_ns();
      step_close_state(e, now);
      if (e->coll != NULL) {
        __atomic_add_fetch(&e->coll->net_wait_ns, e->wait_ns, __ATOMIC_RELEASE);
        if (detail_wanted(now))
          write_part_record(BPFDYNO_REC_PROXY_STEP, e->comm, e->coll, (uint8_t)e->state,
                            e->channel, (uint32_t)e->step, e->start_ns, now - e->start_ns, 0, 0,
                            e->wait_ns, e->bytes);
        coll_unref(e->coll);
      }
      free(e);
      break;
    }
    default:
      break;
  }
  return ncclSuccess;
}

static ncclResult_t plugin_record_event_state(void* handle, ncclProfilerEventState_v5_t state,
                                              ncclProfilerEventStateArgs_v5_t* args) {
  if (handle == NULL) return ncclSuccess;
  int kind = *(int*)handle;
  if (kind == EV_PROXY_STEP) {
    struct proxy_step_ev* e = handle;
    uint64_t now = now_ns();
    step_close_state(e, now);
    e->state = (int)state;
    e->state_ns = now;
    if (args != NULL && args->proxyStep.transSize > e->bytes) e->bytes = args->proxyStep.transSize;
  } else if (kind == EV_KERNEL_CH && state == ncclProfilerKernelChStop && args != NULL) {
    ((struct kernel_ch_ev*)handle)->gpu_stop_ns = args->kernelCh.pTimer;
  }
  return ncclSuccess;
}

static ncclResult_t plugin_finalize(void* context) {
  struct comm_ctx* c = context;
  if (c == NULL) return ncclSuccess;
  pthread_mutex_lock(&g_lock);
  if (c->slot >= 0) {
    struct bpfdyno_nccl_comm* s = &g_comms[c->slot];
    pthread_mutex_lock(&c->lock);
    slot_write_begin(s);
    s->state = 2;
    slot_write_end(s);
    pthread_mutex_unlock(&c->lock);
  }
  /* The last communicator takes the file with it: the agent sees the rank leave. */
  if (--g_live_comms == 0 && g_hdr != NULL) {
    unlink(g_path);
    munmap(g_hdr, g_bytes);
    g_hdr = NULL;
    g_comms = NULL;
    g_ring = NULL;
  }
  pthread_mutex_unlock(&g_lock);
  pthread_mutex_destroy(&c->lock);
  free(c);
  return ncclSuccess;
}

/* A process that exits without finalizing NCCL (no destroy_process_group: common) takes its
 * file with it too; only one killed outright leaves it (the agent ignores files of dead pids). A
 * child forked from a trainer leaves its parent's file alone. */
__attribute__((destructor)) static void remove_file_at_exit(void) {
  if (g_hdr != NULL && g_pid == getpid()) unlink(g_path);
}

EXPORT ncclProfiler_v4_t ncclProfiler_v4 = {
    .name = "bpfdyno",
    .init = plugin_init_v4,
    .startEvent = plugin_start_event_v4,
    .stopEvent = plugin_stop_event,
    .recordEventState = plugin_record_event_state,
    .finalize = plugin_finalize,
};

EXPORT ncclProfiler_v5_t ncclProfiler_v5 = {
    .name = "bpfdyno",
    .init = plugin_init,
    .startEvent = plugin_start_event,
    .stopEvent = plugin_stop_event,
    .recordEventState = plugin_record_event_state,
    .finalize = plugin_finalize,
};
