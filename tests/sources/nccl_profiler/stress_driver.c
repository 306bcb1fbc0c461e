/* Drives the plugin from two threads as NCCL does: the launching thread starts and stops
 * (enqueues) collectives; a proxy thread, behind it, starts and ends their kernel channels,
 * proxy operations and steps: for even collectives after the enqueue has stopped, for odd ones
 * the enqueue stops while they run (the launching thread waits for them to start).
 *
 *   stress_driver PLUGIN.so N   prints "done" after N collectives, finalizes on a stdin line.
 *
 * The queue between the threads holds at most 64 collectives, well under the plugin's pool of
 * 256: a collective's entry is not reused before its parts have started. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "nccl_profiler_abi.h"

#define QUEUE 64

static ncclProfiler_v5_t* p;
static void* ctx;
static long n;
static void* queue[QUEUE];
static long head, tail; /* atomic */
static long started;    /* atomic: collectives whose parts have started */

static void* proxy(void* arg) {
  (void)arg;
  ncclProfilerEventDescr_v5_t ch = {.type = ncclProfileKernelCh};
  ncclProfilerEventDescr_v5_t op = {.type = ncclProfileProxyOp};
  ncclProfilerEventDescr_v5_t step = {.type = ncclProfileProxyStep};
  op.proxyOp.pid = getpid();
  ncclProfilerEventStateArgs_v5_t args = {.proxyStep = {.transSize = 4096}};
  for (long i = 0; i < n; i++) {
    while (__atomic_load_n(&tail, __ATOMIC_ACQUIRE) <= i) sched_yield();
    void* coll = queue[i % QUEUE];
    void *hc, *ho, *hs;
    ch.parentObj = coll;
    ch.kernelCh.channelId = 0;
    ch.kernelCh.pTimer = 1000000 + (uint64_t)i * 100;
    p->startEvent(ctx, &hc, &ch);
    op.parentObj = coll;
    p->startEvent(ctx, &ho, &op);
    step.parentObj = ho;
    p->startEvent(ctx, &hs, &step);
    __atomic_store_n(&started, i + 1, __ATOMIC_RELEASE);
    p->recordEventState(hs, ncclProfilerProxyStepRecvWait, &args);
    p->recordEventState(hs, ncclProfilerProxyStepRecvFlushWait, &args);
    p->stopEvent(hs);
    p->stopEvent(ho);
    uint64_t gpu_stop = 1000000 + (uint64_t)i * 100 + 40;
    ncclProfilerEventStateArgs_v5_t stop = {.kernelCh = {.pTimer = gpu_stop}};
    p->recordEventState(hc, ncclProfilerKernelChStop, &stop);
    p->stopEvent(hc);
    __atomic_store_n(&head, i + 1, __ATOMIC_RELEASE);
  }
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL || (p = dlsym(lib, "ncclProfiler_v5")) == NULL) {
    fprintf(stderr, "%s\n", dlerror());
    return 1;
  }
  n = atol(argv[2]);
  int mask;
  if (p->init(&ctx, 7, &mask, "stress", 1, 2, 0, NULL) != ncclSuccess) return 1;
  pthread_t t;
  pthread_create(&t, NULL, proxy, NULL);
  ncclProfilerEventDescr_v5_t coll = {.type = ncclProfileColl};
  coll.coll.func = "AllReduce";
  coll.coll.datatype = "ncclFloat32";
  coll.coll.count = 1024;
  coll.coll.nChannels = 1;
  for (long i = 0; i < n; i++) {
    while (i - __atomic_load_n(&head, __ATOMIC_ACQUIRE) >= QUEUE) sched_yield();
    void* h;
    coll.coll.seqNumber = (uint64_t)i;
    p->startEvent(ctx, &h, &coll);
    if (h == NULL) return 3;
    queue[i % QUEUE] = h;
    __atomic_store_n(&tail, i + 1, __ATOMIC_RELEASE);
    if (i % 2)
      while (__atomic_load_n(&started, __ATOMIC_ACQUIRE) <= i) sched_yield();
    p->stopEvent(h);
  }
  pthread_join(t, NULL);
  printf("done\n");
  fflush(stdout);
  char line[8];
  if (fgets(line, sizeof(line), stdin) == NULL) return 4;
  p->finalize(ctx);
  return 0;
}
