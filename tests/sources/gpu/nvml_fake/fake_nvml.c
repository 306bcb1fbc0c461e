/*
 * A stand-in for the NVIDIA driver's libnvidia-ml.so.1, for tests on machines without a GPU.
 *
 * It implements exactly the NVML functions that bpfdyno's GPU collector and pynvml's
 * initialisation call, with the struct layouts and return codes of nvml.h, so the real
 * pynvml bindings load it and the collector runs its production code path unchanged.
 *
 * Values are chosen by the test through a small key=value control file named by the
 * FAKE_NVML_CONTROL environment variable. The file is re-read whenever it changes (tests
 * replace it atomically), so a test can change values mid-run: lose a GPU, unload the
 * "driver", queue an XID event. A value that is not set is reported as
 * NVML_ERROR_NOT_SUPPORTED, like a GPU that lacks the feature.
 *
 * Keys (N is a GPU index):
 *   driver=loaded|unloaded|mismatch   nvmlInitWithFlags fails with DRIVER_NOT_LOADED or
 *                                     LIB_RM_VERSION_MISMATCH; device calls return GPU_IS_LOST
 *   driver_version=550.54.15          device_count=2          clock_us=<field timestamps>
 *   gpu.N.uuid / name / pci_bus_id / pci_device_id / minor (the /dev/nvidia<minor> number)
 *   gpu.N.lost=1                      every call on this GPU returns GPU_IS_LOST
 *   gpu.N.util_gpu / util_mem         percent
 *   gpu.N.mem_total / mem_free / mem_used / mem_reserved   bytes
 *   gpu.N.power_mw / power_limit_mw   gpu.N.temp_c          gpu.N.clock_sm_mhz / clock_mem_mhz
 *   gpu.N.pcie_tx_kbps / pcie_rx_kbps gpu.N.nvlink_tx_kib / nvlink_rx_kib (cumulative)
 *   gpu.N.ecc_corrected / ecc_uncorrected (volatile)      gpu.N.throttle (bitmask)
 *   gpu.N.mig_current / mig_pending   gpu.N.event_types (supported event mask)
 *   gpu.N.procs=pid:bytes,...         gpu.N.proc_util=pid:ts_us:sm:mem,...
 *   gpu.N.gpm=1                       gpu.N.gpm.<metric id>=<value>
 *   err.<function>=<code>, gpu.N.err.<function>=<code>   force a return code
 *   field_missing_code=<code>         how nvmlDeviceGetFieldValues answers a field the GPU
 *                                     lacks, per entry (default NOT_SUPPORTED; older drivers
 *                                     answer an unknown id with INVALID_ARGUMENT)
 *   events=gpu:type:data;...          queue of events delivered by nvmlEventSetWait_v2
 *
 * Build variants: -DFAKE_OLD_DRIVER leaves out functions an old driver lacks: GPM,
 * nvmlDeviceGetPcieThroughput, nvmlDeviceGetCurrentClocksEventReasons,
 * nvmlDeviceGetMemoryInfo_v2 and nvmlDeviceGetTemperatureV.
 *
 * Test introspection, not NVML: fake_nvml_call_count(function, gpu) says how often a function
 * was called (for one GPU, or all with gpu = -1), fake_nvml_reset_counts() zeroes the counts,
 * fake_nvml_init_refcount() returns the inits not yet matched by a shutdown.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- nvml.h subset: return codes, handles, structs (layouts as in nvml.h) ---- */

typedef enum nvmlReturn_enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
} nvmlReturn_t;

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlEventSet_st *nvmlEventSet_t;
typedef struct nvmlGpmSample_st *nvmlGpmSample_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
#define NVML_STRUCT_VERSION(size, ver) ((unsigned int)(size) | ((unsigned int)(ver) << 24U))
#define nvmlMemory_v2 NVML_STRUCT_VERSION(sizeof(nvmlMemory_v2_t), 2)

typedef union {
    double dVal;
    int siVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType; /* nvmlValueType_t */
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;
#define NVML_VALUE_TYPE_UNSIGNED_INT 1
#define NVML_VALUE_TYPE_UNSIGNED_LONG_LONG 3
#define NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX 138
#define NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX 139
#define NVML_FI_DEV_POWER_AVERAGE 185
#define NVML_FI_DEV_PCIE_COUNT_TX_BYTES 197
#define NVML_FI_DEV_PCIE_COUNT_RX_BYTES 198

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

typedef struct {
    unsigned int version;
    unsigned int isSupportedDevice;
} nvmlGpmSupport_t;
#define NVML_GPM_SUPPORT_VERSION 1

typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct {
        char *shortName;
        char *longName;
        char *unit;
    } metricInfo;
} nvmlGpmMetric_t;

#define NVML_GPM_METRIC_MAX 477
typedef struct {
    unsigned int version;
    unsigned int numMetrics;
    nvmlGpmSample_t sample1;
    nvmlGpmSample_t sample2;
    nvmlGpmMetric_t metrics[NVML_GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;
#define NVML_GPM_METRICS_GET_VERSION 1

_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t layout");
_Static_assert(nvmlMemory_v2 == 0x02000028, "nvmlMemory_v2 version");
_Static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t layout");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t layout");
_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "sample layout");
_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t layout");
_Static_assert(sizeof(nvmlGpmMetric_t) == 40, "nvmlGpmMetric_t layout");

/* ---- the control file ---- */

#define MAX_GPUS 16
#define MAX_ENTRIES 2048
#define KEY_LEN 96
#define VAL_LEN 1024

struct entry {
    char key[KEY_LEN];
    char val[VAL_LEN];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry entries[MAX_ENTRIES];
static int n_entries;
static char loaded_path[4096];
static struct stat loaded_stat;
static int init_refcount;

/* Re-reads the control file when its path, inode, size or mtime changed. Caller holds lock. */
static void reload_locked(void) {
    const char *path = getenv("FAKE_NVML_CONTROL");
    struct stat st;
    if (path == NULL || stat(path, &st) != 0) {
        n_entries = 0;
        loaded_path[0] = '\0';
        return;
    }
    if (strcmp(path, loaded_path) == 0 && st.st_ino == loaded_stat.st_ino &&
        st.st_size == loaded_stat.st_size &&
        st.st_mtim.tv_sec == loaded_stat.st_mtim.tv_sec &&
        st.st_mtim.tv_nsec == loaded_stat.st_mtim.tv_nsec)
        return;
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        n_entries = 0;
        return;
    }
    n_entries = 0;
    char line[KEY_LEN + VAL_LEN + 8];
    while (fgets(line, sizeof line, f) != NULL) {
        if (n_entries == MAX_ENTRIES) {
            fprintf(stderr, "fake_nvml: %s has more than %d entries; the rest is ignored\n",
                    path, MAX_ENTRIES);
            break;
        }
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '#' || line[0] == '\0')
            continue;
        char *eq = strchr(line, '=');
        if (eq == NULL)
            continue;
        *eq = '\0';
        snprintf(entries[n_entries].key, KEY_LEN, "%.95s", line);
        snprintf(entries[n_entries].val, VAL_LEN, "%.1023s", eq + 1);
        n_entries++;
    }
    fclose(f);
    snprintf(loaded_path, sizeof loaded_path, "%s", path);
    loaded_stat = st;
}

/* Copies the value of `key` into out; returns 1 if it is set. */
static int cfg_get(const char *key, char *out, size_t n) {
    int found = 0;
    pthread_mutex_lock(&lock);
    reload_locked();
    for (int i = n_entries - 1; i >= 0; i--) { /* the last assignment wins */
        if (strcmp(entries[i].key, key) == 0) {
            snprintf(out, n, "%s", entries[i].val);
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return found;
}

static int cfg_u64(const char *key, unsigned long long *out) {
    char buf[64];
    if (!cfg_get(key, buf, sizeof buf))
        return 0;
    *out = strtoull(buf, NULL, 0);
    return 1;
}

static int gpu_get(int idx, const char *field, char *out, size_t n) {
    char key[KEY_LEN];
    snprintf(key, sizeof key, "gpu.%d.%.60s", idx, field);
    return cfg_get(key, out, n);
}

static int gpu_u64(int idx, const char *field, unsigned long long *out) {
    char key[KEY_LEN];
    snprintf(key, sizeof key, "gpu.%d.%.60s", idx, field);
    return cfg_u64(key, out);
}

/* ---- call counters (test introspection) ---- */

struct counter {
    const char *fn;
    int gpu;
    unsigned long count;
};
static struct counter counters[512];
static int n_counters;

static void count_call(const char *fn, int gpu) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_counters; i++) {
        if (counters[i].gpu == gpu && strcmp(counters[i].fn, fn) == 0) {
            counters[i].count++;
            pthread_mutex_unlock(&lock);
            return;
        }
    }
    if (n_counters < (int)(sizeof counters / sizeof counters[0]))
        counters[n_counters++] = (struct counter){fn, gpu, 1};
    pthread_mutex_unlock(&lock);
}

unsigned long fake_nvml_call_count(const char *fn, int gpu) {
    unsigned long total = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_counters; i++)
        if (strcmp(counters[i].fn, fn) == 0 && (gpu < 0 || counters[i].gpu == gpu))
            total += counters[i].count;
    pthread_mutex_unlock(&lock);
    return total;
}

void fake_nvml_reset_counts(void) {
    pthread_mutex_lock(&lock);
    n_counters = 0;
    pthread_mutex_unlock(&lock);
}

/* How many nvmlInitWithFlags calls are not yet matched by nvmlShutdown. */
int fake_nvml_init_refcount(void) {
    pthread_mutex_lock(&lock);
    int n = init_refcount;
    pthread_mutex_unlock(&lock);
    return n;
}

/* ---- common checks ---- */

struct nvmlDevice_st {
    int index;
};
static struct nvmlDevice_st devices[MAX_GPUS];

static int driver_loaded(void) {
    char buf[32];
    return !cfg_get("driver", buf, sizeof buf) || strcmp(buf, "loaded") == 0;
}

static unsigned int device_count(void) {
    unsigned long long n = 0;
    cfg_u64("device_count", &n);
    return n > MAX_GPUS ? MAX_GPUS : (unsigned int)n;
}

/* A forced return code from err.<fn> or gpu.N.err.<fn>, else NVML_SUCCESS. */
static nvmlReturn_t forced(const char *fn, int idx) {
    char key[KEY_LEN];
    unsigned long long code;
    if (idx >= 0) {
        snprintf(key, sizeof key, "gpu.%d.err.%s", idx, fn);
        if (cfg_u64(key, &code))
            return (nvmlReturn_t)code;
    }
    snprintf(key, sizeof key, "err.%s", fn);
    if (cfg_u64(key, &code))
        return (nvmlReturn_t)code;
    return NVML_SUCCESS;
}

static nvmlReturn_t lib_check(const char *fn) {
    count_call(fn, -1);
    pthread_mutex_lock(&lock);
    int up = init_refcount > 0;
    pthread_mutex_unlock(&lock);
    if (!up)
        return NVML_ERROR_UNINITIALIZED;
    return forced(fn, -1);
}

/* Validates a device handle and applies lost / forced-error state; sets *idx. */
static nvmlReturn_t dev_check(const char *fn, nvmlDevice_t dev, int *idx) {
    if (dev < &devices[0] || dev >= &devices[MAX_GPUS]) {
        count_call(fn, -1);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *idx = dev->index;
    count_call(fn, *idx);
    pthread_mutex_lock(&lock);
    int up = init_refcount > 0;
    pthread_mutex_unlock(&lock);
    if (!up)
        return NVML_ERROR_UNINITIALIZED;
    unsigned long long lost = 0;
    if (!driver_loaded() || (unsigned int)*idx >= device_count() ||
        (gpu_u64(*idx, "lost", &lost) && lost))
        return NVML_ERROR_GPU_IS_LOST;
    return forced(fn, *idx);
}

#define DEV_ENTER(dev)                                                                            \
    int idx;                                                                                      \
    nvmlReturn_t rc_ = dev_check(__func__, (dev), &idx);                                          \
    if (rc_ != NVML_SUCCESS)                                                                      \
    return rc_

/* Reads gpu.<idx>.<field> as an unsigned int into *out, or returns NOT_SUPPORTED. */
#define DEV_UINT(field, out)                                                                      \
    do {                                                                                          \
        unsigned long long v_;                                                                    \
        if (!gpu_u64(idx, (field), &v_))                                                          \
            return NVML_ERROR_NOT_SUPPORTED;                                                      \
        *(out) = (unsigned int)v_;                                                                \
    } while (0)

static long long now_us(void) {
    unsigned long long fixed;
    if (cfg_u64("clock_us", &fixed))
        return (long long)fixed;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

/* ---- library ---- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    count_call(__func__, -1);
    char drv[32];
    if (cfg_get("driver", drv, sizeof drv)) {
        if (strcmp(drv, "unloaded") == 0)
            return NVML_ERROR_DRIVER_NOT_LOADED;
        if (strcmp(drv, "mismatch") == 0)
            return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    }
    nvmlReturn_t rc = forced(__func__, -1);
    if (rc != NVML_SUCCESS)
        return rc;
    pthread_mutex_lock(&lock);
    init_refcount++;
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
    count_call(__func__, -1);
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    if (init_refcount == 0)
        rc = NVML_ERROR_UNINITIALIZED;
    else
        init_refcount--;
    pthread_mutex_unlock(&lock);
    return rc;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t rc = lib_check(__func__);
    if (rc != NVML_SUCCESS)
        return rc;
    char buf[80] = "999.99.99";
    cfg_get("driver_version", buf, sizeof buf);
    if (version == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(buf) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(version, buf);
    return NVML_SUCCESS;
}

/* ---- devices ---- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    nvmlReturn_t rc = lib_check(__func__);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!driver_loaded())
        return NVML_ERROR_DRIVER_NOT_LOADED;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = device_count();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    nvmlReturn_t rc = lib_check(__func__);
    if (rc != NVML_SUCCESS)
        return rc;
    if (device == NULL || index >= device_count())
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long lost = 0;
    if (!driver_loaded() || (gpu_u64((int)index, "lost", &lost) && lost))
        return NVML_ERROR_GPU_IS_LOST;
    devices[index].index = (int)index;
    *device = &devices[index];
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_string(int idx, const char *field, char *out, unsigned int length) {
    char buf[256];
    if (!gpu_get(idx, field, buf, sizeof buf))
        return NVML_ERROR_NOT_SUPPORTED;
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(buf) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, buf);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEV_ENTER(device);
    return copy_string(idx, "uuid", uuid, length);
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    DEV_ENTER(device);
    if (minor == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    DEV_UINT("minor", minor);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    DEV_ENTER(device);
    return copy_string(idx, "name", name, length);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEV_ENTER(device);
    char bus_id[64];
    if (!gpu_get(idx, "pci_bus_id", bus_id, sizeof bus_id))
        return NVML_ERROR_NOT_SUPPORTED;
    memset(pci, 0, sizeof *pci);
    unsigned int domain = 0, bus = 0, dev = 0;
    sscanf(bus_id, "%x:%x:%x", &domain, &bus, &dev);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    unsigned long long id = 0;
    gpu_u64(idx, "pci_device_id", &id);
    pci->pciDeviceId = (unsigned int)id;
    snprintf(pci->busId, sizeof pci->busId, "%.31s", bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", domain & 0xffff, bus,
             dev);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *util) {
    DEV_ENTER(device);
    DEV_UINT("util_gpu", &util->gpu);
    DEV_UINT("util_mem", &util->memory);
    return NVML_SUCCESS;
}

static nvmlReturn_t mem_fields(int idx, unsigned long long *total, unsigned long long *free_,
                               unsigned long long *used) {
    if (!gpu_u64(idx, "mem_total", total) || !gpu_u64(idx, "mem_free", free_) ||
        !gpu_u64(idx, "mem_used", used))
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    DEV_ENTER(device);
    return mem_fields(idx, &memory->total, &memory->free, &memory->used);
}

#ifndef FAKE_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    DEV_ENTER(device);
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (!gpu_u64(idx, "mem_reserved", &memory->reserved))
        return NVML_ERROR_NOT_SUPPORTED;
    return mem_fields(idx, &memory->total, &memory->free, &memory->used);
}
#endif

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    DEV_ENTER(device);
    DEV_UINT("power_mw", power);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    DEV_ENTER(device);
    DEV_UINT("power_limit_mw", limit);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temp) {
    DEV_ENTER(device);
    if (sensor != 0) /* NVML_TEMPERATURE_GPU */
        return NVML_ERROR_INVALID_ARGUMENT;
    DEV_UINT("temp_c", temp);
    return NVML_SUCCESS;
}

#ifndef FAKE_OLD_DRIVER
typedef struct {
    unsigned int version;
    int sensorType;
    int temperature;
} nvmlTemperature_t;
#define nvmlTemperature_v1 NVML_STRUCT_VERSION(sizeof(nvmlTemperature_t), 1)
_Static_assert(nvmlTemperature_v1 == 0x100000C, "nvmlTemperature_v1 version");

nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature) {
    DEV_ENTER(device);
    if (temperature == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (temperature->version != nvmlTemperature_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temperature->sensorType != 0) /* NVML_TEMPERATURE_GPU */
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int t;
    DEV_UINT("temp_c", &t);
    temperature->temperature = (int)t;
    return NVML_SUCCESS;
}
#endif

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    DEV_ENTER(device);
    if (type == 1) /* NVML_CLOCK_SM */
        DEV_UINT("clock_sm_mhz", clock);
    else if (type == 2) /* NVML_CLOCK_MEM */
        DEV_UINT("clock_mem_mhz", clock);
    else
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

#ifndef FAKE_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, int counter, unsigned int *value) {
    DEV_ENTER(device);
    if (counter == 0) /* NVML_PCIE_UTIL_TX_BYTES */
        DEV_UINT("pcie_tx_kbps", value);
    else if (counter == 1)
        DEV_UINT("pcie_rx_kbps", value);
    else
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}
#endif

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                      nvmlFieldValue_t *values) {
    DEV_ENTER(device);
    if (values == NULL || valuesCount < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        const char *field = NULL;
        unsigned int scope = 0; /* the all-links aggregate (UINT_MAX) for NVLink */
        int type = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        if (v->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX) {
            field = "nvlink_tx_kib";
            scope = UINT_MAX;
        } else if (v->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX) {
            field = "nvlink_rx_kib";
            scope = UINT_MAX;
        } else if (v->fieldId == NVML_FI_DEV_POWER_AVERAGE) {
            field = "power_avg_mw"; /* a driver without the field: leave the key out */
            type = NVML_VALUE_TYPE_UNSIGNED_INT;
        } else if (v->fieldId == NVML_FI_DEV_PCIE_COUNT_TX_BYTES) {
            field = "pcie_tx_bytes";
        } else if (v->fieldId == NVML_FI_DEV_PCIE_COUNT_RX_BYTES) {
            field = "pcie_rx_bytes";
        }
        v->timestamp = now_us();
        v->latencyUsec = 0;
        v->valueType = type;
        unsigned long long value = 0;
        if (field == NULL || v->scopeId != scope || !gpu_u64(idx, field, &value)) {
            /* Drivers differ in how they answer a field they lack: NOT_SUPPORTED, or
             * INVALID_ARGUMENT for an id older than the driver (field_missing_code). */
            unsigned long long missing = NVML_ERROR_NOT_SUPPORTED;
            cfg_u64("field_missing_code", &missing);
            v->nvmlReturn = (nvmlReturn_t)missing;
            continue;
        }
        if (type == NVML_VALUE_TYPE_UNSIGNED_INT)
            v->value.uiVal = (unsigned int)value;
        else
            v->value.ullVal = value;
        v->nvmlReturn = NVML_SUCCESS;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType, int counterType,
                                         unsigned long long *count) {
    DEV_ENTER(device);
    if (counterType != 0) /* only NVML_VOLATILE_ECC is modelled */
        return NVML_ERROR_NOT_SUPPORTED;
    if (!gpu_u64(idx, errorType == 0 ? "ecc_corrected" : "ecc_uncorrected", count))
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

static nvmlReturn_t throttle(int idx, unsigned long long *reasons) {
    if (!gpu_u64(idx, "throttle", reasons))
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

#ifndef FAKE_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                    unsigned long long *reasons) {
    DEV_ENTER(device);
    return throttle(idx, reasons);
}
#endif

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                       unsigned long long *reasons) {
    DEV_ENTER(device);
    return throttle(idx, reasons);
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current,
                                  unsigned int *pending) {
    DEV_ENTER(device);
    DEV_UINT("mig_current", current);
    DEV_UINT("mig_pending", pending);
    return NVML_SUCCESS;
}

/* ---- processes ---- */

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    DEV_ENTER(device);
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    char list[VAL_LEN];
    nvmlProcessInfo_t found[64];
    unsigned int n = 0;
    if (!gpu_get(idx, "procs", list, sizeof list))
        return NVML_ERROR_NOT_SUPPORTED;
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok != NULL && n < 64;
         tok = strtok_r(NULL, ",", &save)) {
        unsigned int pid;
        unsigned long long bytes;
        if (sscanf(tok, "%u:%llu", &pid, &bytes) == 2)
            found[n++] = (nvmlProcessInfo_t){pid, bytes, 0xFFFFFFFFu, 0xFFFFFFFFu};
    }
    if (n == 0) {
        *count = 0;
        return NVML_SUCCESS;
    }
    if (infos == NULL || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(infos, found, n * sizeof found[0]);
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                             nvmlProcessUtilizationSample_t *samples,
                                             unsigned int *count,
                                             unsigned long long lastSeenTimeStamp) {
    DEV_ENTER(device);
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    char list[VAL_LEN];
    nvmlProcessUtilizationSample_t found[64];
    unsigned int n = 0;
    if (!gpu_get(idx, "proc_util", list, sizeof list))
        return NVML_ERROR_NOT_SUPPORTED;
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok != NULL && n < 64;
         tok = strtok_r(NULL, ",", &save)) {
        unsigned int pid, sm, mem;
        unsigned long long ts;
        if (sscanf(tok, "%u:%llu:%u:%u", &pid, &ts, &sm, &mem) == 4 && ts > lastSeenTimeStamp)
            found[n++] = (nvmlProcessUtilizationSample_t){pid, ts, sm, mem, 0, 0};
    }
    if (n == 0)
        return NVML_ERROR_NOT_FOUND; /* no sample newer than lastSeenTimeStamp */
    if (samples == NULL || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(samples, found, n * sizeof found[0]);
    *count = n;
    return NVML_SUCCESS;
}

/* ---- GPM (Hopper and newer) ---- */

#ifndef FAKE_OLD_DRIVER
#define SAMPLE_MAGIC 0x47504d53u
struct nvmlGpmSample_st {
    unsigned int magic;
    int gpu; /* -1 until nvmlGpmSampleGet fills it */
    unsigned long long seq;
};
static unsigned long long sample_seq;

static int gpm_supported(int idx) {
    unsigned long long on = 0;
    return gpu_u64(idx, "gpm", &on) && on;
}

nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *support) {
    DEV_ENTER(device);
    if (support == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (support->version != NVML_GPM_SUPPORT_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    support->isSupportedDevice = (unsigned int)gpm_supported(idx);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *sample) {
    nvmlReturn_t rc = lib_check(__func__);
    if (rc != NVML_SUCCESS)
        return rc;
    if (sample == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct nvmlGpmSample_st *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NVML_ERROR_UNKNOWN;
    s->magic = SAMPLE_MAGIC;
    s->gpu = -1;
    *sample = s;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
    count_call(__func__, -1);
    if (sample == NULL || sample->magic != SAMPLE_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    sample->magic = 0;
    free(sample);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t sample) {
    DEV_ENTER(device);
    if (sample == NULL || sample->magic != SAMPLE_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpm_supported(idx))
        return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&lock);
    sample->gpu = idx;
    sample->seq = ++sample_seq;
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}

static const char *metric_name(unsigned int id) {
    switch (id) {
    case 1: return "GR_ENGINE_ACTIVE";
    case 2: return "SM_ACTIVE";
    case 3: return "SM_OCCUPANCY";
    case 5: return "ANY_TENSOR_ACTIVE";
    case 10: return "DRAM_BW_UTIL";
    default: return NULL;
    }
}

nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *m) {
    nvmlReturn_t rc = lib_check(__func__);
    if (rc != NVML_SUCCESS)
        return rc;
    if (m == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != NVML_GPM_METRICS_GET_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlGpmSample_t s1 = m->sample1, s2 = m->sample2;
    /* Metrics are defined over an interval: two filled samples of one GPU, in order. */
    if (m->numMetrics > NVML_GPM_METRIC_MAX || s1 == NULL || s2 == NULL ||
        s1->magic != SAMPLE_MAGIC || s2->magic != SAMPLE_MAGIC || s1->gpu < 0 ||
        s1->gpu != s2->gpu || s2->seq <= s1->seq)
        return NVML_ERROR_INVALID_ARGUMENT;
    int idx = s1->gpu;
    unsigned long long lost = 0;
    if (!driver_loaded() || (gpu_u64(idx, "lost", &lost) && lost))
        return NVML_ERROR_GPU_IS_LOST;
    for (unsigned int i = 0; i < m->numMetrics; i++) {
        nvmlGpmMetric_t *metric = &m->metrics[i];
        char key[KEY_LEN], val[64];
        snprintf(key, sizeof key, "gpm.%u", metric->metricId);
        const char *name = metric_name(metric->metricId);
        metric->metricInfo.shortName = (char *)name;
        metric->metricInfo.longName = (char *)name;
        metric->metricInfo.unit = (char *)"%";
        if (gpu_get(idx, key, val, sizeof val)) {
            metric->value = strtod(val, NULL);
            metric->nvmlReturn = NVML_SUCCESS;
        } else {
            metric->value = 0.0;
            metric->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return NVML_SUCCESS;
}
#endif /* FAKE_OLD_DRIVER */

/* ---- events ---- */

#define MAX_SETS 16
struct nvmlEventSet_st {
    int in_use;
    unsigned int cursor; /* queue entries already seen by this set */
    unsigned long long mask[MAX_GPUS];
};
static struct nvmlEventSet_st sets[MAX_SETS];

struct queued_event {
    int gpu;
    unsigned long long type;
    unsigned long long data;
};

/* Parses the `events` queue; returns the number of entries (at most max). */
static unsigned int read_queue(struct queued_event *out, unsigned int max) {
    char list[VAL_LEN];
    unsigned int n = 0;
    if (!cfg_get("events", list, sizeof list))
        return 0;
    for (char *save = NULL, *tok = strtok_r(list, ";", &save); tok != NULL && n < max;
         tok = strtok_r(NULL, ";", &save)) {
        int gpu;
        unsigned long long type, data;
        if (sscanf(tok, "%d:%lli:%lli", &gpu, &type, &data) == 3)
            out[n++] = (struct queued_event){gpu, type, data};
    }
    return n;
}

static int valid_set(nvmlEventSet_t set) {
    return set >= &sets[0] && set < &sets[MAX_SETS] && set->in_use;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    nvmlReturn_t rc = lib_check(__func__);
    if (rc != NVML_SUCCESS)
        return rc;
    if (set == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct queued_event q[128];
    unsigned int queued = read_queue(q, 128);
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_SETS; i++) {
        if (!sets[i].in_use) {
            memset(&sets[i], 0, sizeof sets[i]);
            sets[i].in_use = 1;
            sets[i].cursor = queued; /* events from before the set existed are not seen */
            *set = &sets[i];
            pthread_mutex_unlock(&lock);
            return NVML_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    return NVML_ERROR_UNKNOWN;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    count_call(__func__, -1);
    pthread_mutex_lock(&lock);
    int ok = valid_set(set);
    if (ok)
        set->in_use = 0;
    pthread_mutex_unlock(&lock);
    return ok ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                              unsigned long long *eventTypes) {
    DEV_ENTER(device);
    if (!gpu_u64(idx, "event_types", eventTypes))
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                      nvmlEventSet_t set) {
    DEV_ENTER(device);
    unsigned long long supported = 0;
    if (!gpu_u64(idx, "event_types", &supported) || (eventTypes & ~supported) != 0)
        return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&lock);
    int ok = valid_set(set);
    if (ok)
        set->mask[idx] |= eventTypes;
    pthread_mutex_unlock(&lock);
    return ok ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                 unsigned int timeoutms) {
    nvmlReturn_t rc = lib_check(__func__);
    if (rc != NVML_SUCCESS)
        return rc;
    if (data == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        struct queued_event q[128];
        unsigned int queued = read_queue(q, 128);
        pthread_mutex_lock(&lock);
        if (!valid_set(set)) {
            pthread_mutex_unlock(&lock);
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        while (set->cursor < queued) {
            struct queued_event e = q[set->cursor++];
            if (e.gpu >= 0 && e.gpu < MAX_GPUS && (set->mask[e.gpu] & e.type) != 0) {
                data->device = &devices[e.gpu];
                data->eventType = e.type;
                data->eventData = e.data;
                data->gpuInstanceId = 0xFFFFFFFFu;
                data->computeInstanceId = 0xFFFFFFFFu;
                pthread_mutex_unlock(&lock);
                return NVML_SUCCESS;
            }
        }
        unsigned long long registered = 0;
        for (int g = 0; g < MAX_GPUS; g++)
            if (set->mask[g] != 0)
                registered |= 1ULL << g;
        pthread_mutex_unlock(&lock);
        if (!driver_loaded())
            return NVML_ERROR_GPU_IS_LOST;
        for (int g = 0; g < MAX_GPUS; g++) {
            unsigned long long lost = 0;
            if ((registered & (1ULL << g)) && gpu_u64(g, "lost", &lost) && lost)
                return NVML_ERROR_GPU_IS_LOST;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long waited_ms = (now.tv_sec - start.tv_sec) * 1000LL +
                              (now.tv_nsec - start.tv_nsec) / 1000000LL;
        if (waited_ms >= (long long)timeoutms)
            return NVML_ERROR_TIMEOUT;
        struct timespec nap = {0, 2 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
}
