/* Times the NCCL profiler plugin's entry points as NCCL calls them, in one thread.
 *
 *   nccl_plugin_driver PLUGIN.so|off KIND N  ->  prints ns per unit of KIND
 *
 * KIND: coll (a collective's startEvent + stopEvent), step (a proxy step: startEvent, three
 * recordEventState, stopEvent), full (one AllReduce on 2 channels as NCCL reports it: the
 * collective, 2 kernel channels with their stop state, 2 proxy operations with 1 step each).
 * "off" runs the same calls into empty functions: what a call through NCCL's function
 * pointers costs with a plugin that does nothing. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl_profiler_abi.h"

static ncclResult_t off_init(void** c, uint64_t id, int* m, const char* n, int nn, int nr, int r,
                             ncclDebugLogger_t l) {
  (void)id, (void)n, (void)nn, (void)nr, (void)r, (void)l;
  *c = (void*)1;
  *m = 0;
  return ncclSuccess;
}
static ncclResult_t off_start(void* c, void** h, ncclProfilerEventDescr_v5_t* d) {
  (void)c;
  *h = (void*)d;
  return ncclSuccess;
}
static ncclResult_t off_stop(void* h) { (void)h; return ncclSuccess; }
static ncclResult_t off_state(void* h, ncclProfilerEventState_v5_t s,
                              ncclProfilerEventStateArgs_v5_t* a) {
  (void)h, (void)s, (void)a;
  return ncclSuccess;
}
static ncclResult_t off_fini(void* c) { (void)c; return ncclSuccess; }
static ncclProfiler_v5_t off = {"off", off_init, off_start, off_stop, off_state, off_fini};

/* The thread's CPU time: time this thread was not running (a loaded machine) is not counted. */
static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s PLUGIN.so|off coll|step|full N\n", argv[0]);
    return 2;
  }
  ncclProfiler_v5_t* p = &off;
  if (strcmp(argv[1], "off") != 0) {
    void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL || (p = dlsym(lib, "ncclProfiler_v5")) == NULL) {
      fprintf(stderr, "%s\n", dlerror());
      return 1;
    }
  }
  const char* kind = argv[2];
  long n = atol(argv[3]);
  void* ctx;
  int mask;
  if (p->init(&ctx, 42, &mask, "bench", 1, 2, 0, NULL) != ncclSuccess) return 1;
  ncclProfilerEventDescr_v5_t coll = {.type = ncclProfileColl};
  coll.coll.func = "AllReduce";
  coll.coll.datatype = "ncclFloat32";
  coll.coll.count = 1 << 20;
  coll.coll.nChannels = 2;
  coll.coll.algo = "Ring";
  coll.coll.proto = "Simple";
  ncclProfilerEventDescr_v5_t ch = {.type = ncclProfileKernelCh};
  ncclProfilerEventDescr_v5_t op = {.type = ncclProfileProxyOp};
  op.proxyOp.pid = getpid();
  op.proxyOp.nSteps = 1;
  ncclProfilerEventDescr_v5_t step = {.type = ncclProfileProxyStep};
  ncclProfilerEventStateArgs_v5_t args = {.proxyStep = {.transSize = 524288}};
  void *hc, *h1, *h2, *o1, *o2, *s1, *s2;
  double t0 = now_s();
  for (long i = 0; i < n; i++) {
    coll.coll.seqNumber = (uint64_t)i;
    if (strcmp(kind, "coll") == 0) {
      p->startEvent(ctx, &hc, &coll);
      p->stopEvent(hc);
    } else if (strcmp(kind, "step") == 0) {
      if (i == 0) {
        p->startEvent(ctx, &hc, &coll);
        op.parentObj = hc;
        p->startEvent(ctx, &o1, &op);
        step.parentObj = o1;
      }
      p->startEvent(ctx, &s1, &step);
      p->recordEventState(s1, ncclProfilerProxyStepSendGPUWait, &args);
      p->recordEventState(s1, ncclProfilerProxyStepSendPeerWait_v4, &args);
      p->recordEventState(s1, ncclProfilerProxyStepSendWait, &args);
      p->stopEvent(s1);
    } else {
      p->startEvent(ctx, &hc, &coll);
      ch.parentObj = hc;
      ch.kernelCh.channelId = 0;
      ch.kernelCh.pTimer = 1000 + i;
      p->startEvent(ctx, &h1, &ch);
      ch.kernelCh.channelId = 1;
      p->startEvent(ctx, &h2, &ch);
      p->stopEvent(hc);
      op.parentObj = hc;
      op.proxyOp.channelId = 0;
      op.proxyOp.isSend = 1;
      p->startEvent(ctx, &o1, &op);
      op.proxyOp.channelId = 1;
      op.proxyOp.isSend = 0;
      p->startEvent(ctx, &o2, &op);
      step.parentObj = o1;
      p->startEvent(ctx, &s1, &step);
      step.parentObj = o2;
      p->startEvent(ctx, &s2, &step);
      p->recordEventState(s1, ncclProfilerProxyStepSendGPUWait, &args);
      p->recordEventState(s2, ncclProfilerProxyStepRecvWait, &args);
      p->recordEventState(s1, ncclProfilerProxyStepSendWait, &args);
      p->recordEventState(s2, ncclProfilerProxyStepRecvFlushWait, &args);
      p->stopEvent(s1);
      p->stopEvent(s2);
      p->stopEvent(o1);
      p->stopEvent(o2);
      ncclProfilerEventStateArgs_v5_t stop = {.kernelCh = {.pTimer = 2000 + i}};
      p->recordEventState(h1, ncclProfilerKernelChStop, &stop);
      p->recordEventState(h2, ncclProfilerKernelChStop, &stop);
      p->stopEvent(h1);
      p->stopEvent(h2);
    }
  }
  double dt = now_s() - t0;
  printf("%.1f\n", dt * 1e9 / n);
  p->finalize(ctx);
  return 0;
}
