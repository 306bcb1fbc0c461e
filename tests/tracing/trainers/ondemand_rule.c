/* Stands in for a libkineto that restricts on-demand trace files (pytorch/kineto 9ea826e,
 * 2026-06-11, and later), which no PyTorch installable here has: such a library asks for
 * KINETO_ONDEMAND_TRACE_DIR with getenv(), so the name is in its read-only data. The test
 * builds this as libkineto.so and loads it into a real PyTorch trainer. */
#include <stdlib.h>

const char *bpfdyno_test_ondemand_dir(void) { return getenv("KINETO_ONDEMAND_TRACE_DIR"); }
const char *bpfdyno_test_use_daemon(void) { return getenv("KINETO_USE_DAEMON"); }
