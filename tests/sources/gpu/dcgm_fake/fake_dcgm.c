/*
 * A fake libdcgm for tests: the DCGM C ABI (dcgm_agent.h / dcgm_structs.h) for exactly the entry
 * points the dcgm collector uses, with values chosen by the test.
 *
 * Two kinds of host engine, as in DCGM: one embedded in the caller (dcgmStartEmbedded), or a
 * running nv-hostengine reached with dcgmConnect_v2. The latter really connects (TCP
 * "host[:port]", port 5555 by default, or a Unix socket path) to whatever the test listens
 * with, and the connection is lost when that end closes it: calls then answer
 * DCGM_ST_CONNECTION_NOT_VALID, as DCGM's client library does.
 *
 * Values come from the key=value control file named by FAKE_DCGM_CONTROL, re-read on every
 * call so a test can change them between two collections:
 *   engine=up|down      down: the embedded host engine cannot start, and a running one is lost
 *                       (an nv-hostengine is up while its connection is open)
 *                       (dcgmUpdateAllFields answers DCGM_ST_CONNECTION_NOT_VALID)
 *   gpus=0,1            the GPU ids dcgmGetAllSupportedDevices lists
 *   profiling=0         the GPUs have no profiling module: watching a field >= 1001 fails
 *   gpu.<id>.<field>=v  a field's value; absent -> the type's blank, "nodata" -> status NO_DATA
 *   update_ms=N         dcgmUpdateAllFields takes N ms (waiting for an update cycle)
 * While profiling is paused (dcgmProfPause), profiling fields (>= 1001) read as blank.
 *
 * Test introspection, not DCGM: fake_dcgm_call_count(function) says how often a function ran,
 * fake_dcgm_paused() whether profiling is paused, fake_dcgm_watch_freq_us() the last update
 * frequency watched, fake_dcgm_engines() embedded engines started and not stopped,
 * fake_dcgm_connections() nv-hostengine connections open, fake_dcgm_connect_timeout_ms() the
 * timeout of the last dcgmConnect_v2.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define DCGM_ST_OK 0
#define DCGM_ST_BADPARAM (-1)
#define DCGM_ST_INIT_ERROR (-7)
#define DCGM_ST_UNINITIALIZED (-10)
#define DCGM_ST_NO_DATA (-14)
#define DCGM_ST_NOT_WATCHED (-16)
#define DCGM_ST_CONNECTION_NOT_VALID (-21)
#define DCGM_ST_PROFILING_NOT_SUPPORTED (-36)

#define DCGM_OPERATION_MODE_AUTO 1
#define DCGM_GROUP_EMPTY 1
#define DCGM_MAX_NUM_DEVICES 32
#define DCGM_MAX_STR_LENGTH 256
#define DCGM_MAX_BLOB_LENGTH 4096
#define DCGM_INT64_BLANK 0x7ffffffffffffff0LL
#define DCGM_FP64_BLANK 140737488355328.0
#define DCGM_FT_DOUBLE 'd'
#define DCGM_FT_INT64 'i'

typedef int dcgmReturn_t;
typedef uintptr_t dcgmHandle_t;
typedef uintptr_t dcgmGpuGrp_t;
typedef uintptr_t dcgmFieldGrp_t;

typedef struct {
    unsigned int version;
    unsigned short fieldId;
    unsigned short fieldType;
    int status;
    int64_t ts;
    union {
        int64_t i64;
        double dbl;
        char str[DCGM_MAX_STR_LENGTH];
        char blob[DCGM_MAX_BLOB_LENGTH];
    } value;
} dcgmFieldValue_v1;

#define MAKE_DCGM_VERSION(typeName, ver) (unsigned int)(sizeof(typeName) | ((unsigned long)(ver) << 24U))
#define dcgmFieldValue_version1 MAKE_DCGM_VERSION(dcgmFieldValue_v1, 1)

typedef struct {
    unsigned int version;
    unsigned int persistAfterDisconnect;
    unsigned int timeoutMs;
    unsigned int addressIsUnixSocket;
} dcgmConnectV2Params_v2;

#define dcgmConnectV2Params_version2 MAKE_DCGM_VERSION(dcgmConnectV2Params_v2, 2)

/* The layout the Python binding mirrors: a mismatch must fail the build, not a test. */
_Static_assert(sizeof(dcgmFieldValue_v1) == 4120, "dcgmFieldValue_v1 size");
_Static_assert(offsetof(dcgmFieldValue_v1, ts) == 16, "ts offset");
_Static_assert(offsetof(dcgmFieldValue_v1, value) == 24, "value offset");

/* ---- state ---- */

static int initialized;
static int engines;           /* embedded engines started, not stopped */
static int conn_fd = -1;      /* the nv-hostengine connection (-1: none) */
static int connections;       /* nv-hostengine connections open */
static unsigned int connect_timeout_ms;
static dcgmHandle_t handle;   /* the current engine's handle (0: none) */
static int paused;
static long long watch_freq_us;
static unsigned short field_ids[64];
static int n_fields;
static int watched;           /* the field group is watched on the group */
static unsigned int group_gpus[DCGM_MAX_NUM_DEVICES];
static int n_group_gpus;

struct counter { char name[64]; unsigned long n; };
static struct counter counters[64];
static int n_counters;

static void count_call(const char *fn) {
    for (int i = 0; i < n_counters; i++)
        if (strcmp(counters[i].name, fn) == 0) { counters[i].n++; return; }
    if (n_counters < 64) {
        snprintf(counters[n_counters].name, sizeof counters[0].name, "%s", fn);
        counters[n_counters++].n = 1;
    }
}

unsigned long fake_dcgm_call_count(const char *fn) {
    for (int i = 0; i < n_counters; i++)
        if (strcmp(counters[i].name, fn) == 0) return counters[i].n;
    return 0;
}
void fake_dcgm_reset(void) { n_counters = 0; }
int fake_dcgm_paused(void) { return paused; }
long long fake_dcgm_watch_freq_us(void) { return watch_freq_us; }
int fake_dcgm_engines(void) { return engines; }
int fake_dcgm_connections(void) { return connections; }
unsigned int fake_dcgm_connect_timeout_ms(void) { return connect_timeout_ms; }

/* ---- control file ---- */

/* Copies the value of `key` into out; returns 0 when the key is absent. */
static int control(const char *key, char *out, size_t size) {
    const char *path = getenv("FAKE_DCGM_CONTROL");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return 0;
    char line[512];
    size_t klen = strlen(key);
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen) == 0 && line[klen] == '=') {
            line[strcspn(line, "\n")] = 0;
            snprintf(out, size, "%s", line + klen + 1);
            found = 1;
            break;
        }
    }
    fclose(f);
    return found;
}

/* The nv-hostengine end of the connection is still open (nothing to read is fine). */
static int peer_open(int fd) {
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
}

static int engine_up(void) {
    char v[32];
    if (conn_fd >= 0) return peer_open(conn_fd);
    return !control("engine", v, sizeof v) || strcmp(v, "down") != 0;
}

static void close_connection(void) {
    if (conn_fd >= 0) {
        close(conn_fd);
        conn_fd = -1;
        connections--;
    }
}

static int valid(dcgmHandle_t h) { return initialized && h != 0 && h == handle; }

/* ---- the DCGM API ---- */

dcgmReturn_t dcgmInit(void) {
    count_call("dcgmInit");
    initialized = 1;
    return DCGM_ST_OK;
}

dcgmReturn_t dcgmShutdown(void) {
    count_call("dcgmShutdown");
    close_connection();
    initialized = 0;
    handle = 0;
    return DCGM_ST_OK;
}

const char *errorString(dcgmReturn_t result) {
    switch (result) {
    case DCGM_ST_OK: return "Success";
    case DCGM_ST_INIT_ERROR: return "DCGM initialization error";
    case DCGM_ST_CONNECTION_NOT_VALID: return "The connection to the host engine is not valid any longer";
    case DCGM_ST_PROFILING_NOT_SUPPORTED: return "Profiling is not supported for this group of GPUs or GPU";
    default: return "Unknown error";
    }
}

dcgmReturn_t dcgmStartEmbedded(int opMode, dcgmHandle_t *pDcgmHandle) {
    count_call("dcgmStartEmbedded");
    if (!initialized) return DCGM_ST_UNINITIALIZED;
    if (opMode != DCGM_OPERATION_MODE_AUTO || !pDcgmHandle) return DCGM_ST_BADPARAM;
    if (!engine_up()) return DCGM_ST_INIT_ERROR;
    static uintptr_t next = 0x1000;
    handle = next++;
    engines++;
    paused = 0;
    watched = 0;
    n_fields = 0;
    n_group_gpus = 0;
    *pDcgmHandle = handle;
    return DCGM_ST_OK;
}

/* Connects to "host[:port]" (TCP, IPv4) or, with addressIsUnixSocket, to a Unix socket path. */
static int connect_to(const char *address, int unix_socket) {
    int fd;
    if (unix_socket) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        if (strlen(address) >= sizeof sa.sun_path) return -1;
        strcpy(sa.sun_path, address);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) return fd;
    } else {
        char host[256];
        int port = 5555;
        snprintf(host, sizeof host, "%s", address);
        char *colon = strrchr(host, ':');
        if (colon) {
            *colon = 0;
            port = atoi(colon + 1);
        }
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) return -1;
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) return fd;
    }
    if (fd >= 0) close(fd);
    return -1;
}

dcgmReturn_t dcgmConnect_v2(const char *ipAddress, dcgmConnectV2Params_v2 *params,
                            dcgmHandle_t *pDcgmHandle) {
    count_call("dcgmConnect_v2");
    if (!initialized) return DCGM_ST_UNINITIALIZED;
    if (!ipAddress || !params || !pDcgmHandle || params->version != dcgmConnectV2Params_version2)
        return DCGM_ST_BADPARAM;
    connect_timeout_ms = params->timeoutMs;
    int fd = connect_to(ipAddress, params->addressIsUnixSocket != 0);
    if (fd < 0) return DCGM_ST_CONNECTION_NOT_VALID;
    close_connection();
    static uintptr_t next = 0x8000;
    handle = next++;
    conn_fd = fd;
    connections++;
    paused = 0;
    watched = 0;
    n_fields = 0;
    n_group_gpus = 0;
    *pDcgmHandle = handle;
    return DCGM_ST_OK;
}

dcgmReturn_t dcgmDisconnect(dcgmHandle_t h) {
    count_call("dcgmDisconnect");
    if (!valid(h) || conn_fd < 0) return DCGM_ST_BADPARAM;
    close_connection();
    handle = 0;
    return DCGM_ST_OK;
}

dcgmReturn_t dcgmStopEmbedded(dcgmHandle_t h) {
    count_call("dcgmStopEmbedded");
    if (!valid(h) || conn_fd >= 0) return DCGM_ST_BADPARAM; /* a connection is not embedded */
    engines--;
    handle = 0;
    return DCGM_ST_OK;
}

dcgmReturn_t dcgmGetAllSupportedDevices(dcgmHandle_t h, unsigned int gpuIdList[DCGM_MAX_NUM_DEVICES], int *count) {
    count_call("dcgmGetAllSupportedDevices");
    if (!valid(h) || !count) return DCGM_ST_BADPARAM;
    if (!engine_up()) return DCGM_ST_CONNECTION_NOT_VALID;
    char v[256];
    int n = 0;
    if (control("gpus", v, sizeof v)) {
        for (char *tok = strtok(v, ","); tok && n < DCGM_MAX_NUM_DEVICES; tok = strtok(NULL, ","))
            gpuIdList[n++] = (unsigned int)strtoul(tok, NULL, 10);
    }
    *count = n;
    return DCGM_ST_OK;
}

dcgmReturn_t dcgmGroupCreate(dcgmHandle_t h, int type, const char *groupName, dcgmGpuGrp_t *pGroup) {
    count_call("dcgmGroupCreate");
    if (!valid(h) || type != DCGM_GROUP_EMPTY || !groupName || !pGroup) return DCGM_ST_BADPARAM;
    n_group_gpus = 0;
    *pGroup = 7;
    return DCGM_ST_OK;
}

dcgmReturn_t dcgmGroupAddDevice(dcgmHandle_t h, dcgmGpuGrp_t group, unsigned int gpuId) {
    count_call("dcgmGroupAddDevice");
    if (!valid(h) || group != 7 || n_group_gpus >= DCGM_MAX_NUM_DEVICES) return DCGM_ST_BADPARAM;
    group_gpus[n_group_gpus++] = gpuId;
    return DCGM_ST_OK;
}

dcgmReturn_t dcgmFieldGroupCreate(dcgmHandle_t h, int numFieldIds, const unsigned short *fieldIds,
                                  const char *name, dcgmFieldGrp_t *pFieldGroup) {
    count_call("dcgmFieldGroupCreate");
    if (!valid(h) || numFieldIds <= 0 || numFieldIds > 64 || !fieldIds || !name || !pFieldGroup)
        return DCGM_ST_BADPARAM;
    memcpy(field_ids, fieldIds, sizeof(unsigned short) * (size_t)numFieldIds);
    n_fields = numFieldIds;
    *pFieldGroup = 9;
    return DCGM_ST_OK;
}

dcgmReturn_t dcgmWatchFields(dcgmHandle_t h, dcgmGpuGrp_t group, dcgmFieldGrp_t fieldGroup,
                             long long updateFreq, double maxKeepAge, int maxKeepSamples) {
    count_call("dcgmWatchFields");
    if (!valid(h) || group != 7 || fieldGroup != 9 || updateFreq <= 0 || maxKeepAge < 0 ||
        maxKeepSamples < 0)
        return DCGM_ST_BADPARAM;
    char v[16];
    if (control("profiling", v, sizeof v) && strcmp(v, "0") == 0)
        for (int i = 0; i < n_fields; i++)
            if (field_ids[i] >= 1001) return DCGM_ST_PROFILING_NOT_SUPPORTED;
    watch_freq_us = updateFreq;
    watched = 1;
    return DCGM_ST_OK;
}

dcgmReturn_t dcgmUpdateAllFields(dcgmHandle_t h, int waitForUpdate) {
    count_call("dcgmUpdateAllFields");
    if (!valid(h)) return DCGM_ST_BADPARAM;
    char v[32];
    if (waitForUpdate && control("update_ms", v, sizeof v)) usleep((useconds_t)atoi(v) * 1000);
    if (!engine_up()) return DCGM_ST_CONNECTION_NOT_VALID;
    return DCGM_ST_OK;
}

static int is_int_field(unsigned short id) {
    /* SM clock (MHz) and the PCIe/NVLink byte rates are int64 fields; the rest are doubles. */
    return id == 100 || (id >= 1009 && id <= 1012);
}

static int in_group(int gpuId) {
    for (int i = 0; i < n_group_gpus; i++)
        if ((int)group_gpus[i] == gpuId) return 1;
    return 0;
}

static int field_watched(unsigned short id) {
    for (int i = 0; watched && i < n_fields; i++)
        if (field_ids[i] == id) return 1;
    return 0;
}

dcgmReturn_t dcgmGetLatestValuesForFields(dcgmHandle_t h, int gpuId, unsigned short fields[],
                                          unsigned int count, dcgmFieldValue_v1 values[]) {
    count_call("dcgmGetLatestValuesForFields");
    if (!valid(h) || !fields || !values || count == 0) return DCGM_ST_BADPARAM;
    if (!engine_up()) return DCGM_ST_CONNECTION_NOT_VALID;
    for (unsigned int i = 0; i < count; i++) {
        dcgmFieldValue_v1 *fv = &values[i];
        unsigned short id = fields[i];
        memset(fv, 0, sizeof *fv);
        fv->version = dcgmFieldValue_version1;
        fv->fieldId = id;
        fv->fieldType = is_int_field(id) ? DCGM_FT_INT64 : DCGM_FT_DOUBLE;
        fv->ts = 1700000000000000LL;
        if (fv->fieldType == DCGM_FT_INT64) fv->value.i64 = DCGM_INT64_BLANK;
        else fv->value.dbl = DCGM_FP64_BLANK;
        if (!in_group(gpuId) || !field_watched(id)) {
            fv->status = DCGM_ST_NOT_WATCHED;
            continue;
        }
        char key[64], v[64];
        snprintf(key, sizeof key, "gpu.%d.%u", gpuId, id);
        if (!control(key, v, sizeof v) || (paused && id >= 1001)) continue; /* blank */
        if (strcmp(v, "nodata") == 0) {
            fv->status = DCGM_ST_NO_DATA;
            continue;
        }
        if (fv->fieldType == DCGM_FT_INT64) fv->value.i64 = strtoll(v, NULL, 10);
        else fv->value.dbl = strtod(v, NULL);
    }
    return DCGM_ST_OK;
}

dcgmReturn_t dcgmProfPause(dcgmHandle_t h) {
    count_call("dcgmProfPause");
    if (!valid(h)) return DCGM_ST_BADPARAM;
    if (!engine_up()) return DCGM_ST_CONNECTION_NOT_VALID;
    paused = 1;
    return DCGM_ST_OK;
}

dcgmReturn_t dcgmProfResume(dcgmHandle_t h) {
    count_call("dcgmProfResume");
    if (!valid(h)) return DCGM_ST_BADPARAM;
    if (!engine_up()) return DCGM_ST_CONNECTION_NOT_VALID;
    paused = 0;
    return DCGM_ST_OK;
}
