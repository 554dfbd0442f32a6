/*
 * A fake NVML driver library (libnvidia-ml.so.1) for gpuledger's tests.
 *
 * It implements exactly the NVML entry points that the official Python bindings
 * (nvidia-ml-py, module pynvml) call for gpuledger's NVML source, with NVML's own
 * header (nvml.h from the nvidia-nvml-dev package), so signatures and structures are
 * the real ones. pynvml loads it with dlopen("libnvidia-ml.so.1"): put the folder that
 * holds it on LD_LIBRARY_PATH of the process that imports pynvml.
 *
 * Scenario file
 * -------------
 * The environment variable FAKE_NVML_SCENARIO names a text file. Without it (or when
 * it cannot be read) nvmlInitWithFlags returns NVML_ERROR_DRIVER_NOT_LOADED. One
 * statement per line; blank lines and lines starting with '#' are ignored:
 *
 *   driver <version>                    driver version string
 *   gpus <count>                        number of GPUs (at most 64)
 *   mig <gpu> <slot> <gi> <ci>          MIG device <slot> (0-based) on GPU <gpu>, in
 *                                       GPU instance <gi>, compute instance <ci>
 *   at <step> <target> <key> <value>    from step <step> on, <key> of <target> is
 *                                       <value> (the rest of the line)
 *
 * <target> is gN (GPU N) or gN.mS (MIG device S of GPU N). Keys and NVML units:
 *   name, uuid          strings (nvmlDeviceGetName / nvmlDeviceGetUUID)
 *   util.gpu, util.mem  percent (nvmlDeviceGetUtilizationRates; both must be set)
 *   mem.total, mem.used bytes (nvmlDeviceGetMemoryInfo; free = total - used)
 *   power               milliwatts (nvmlDeviceGetPowerUsage)
 *   temp                degrees C (nvmlDeviceGetTemperature, GPU sensor)
 *   clock.sm            MHz (nvmlDeviceGetClockInfo, NVML_CLOCK_SM)
 *   pcie.tx, pcie.rx    KB/s (nvmlDeviceGetPcieThroughput)
 *   field.<id>          value of NVML field <id> (nvmlDeviceGetFieldValues), as an
 *                       unsigned 64-bit integer
 *   fieldvalues.error   an NVML return code that nvmlDeviceGetFieldValues answers for
 *                       the whole call (e.g. 3, NOT_SUPPORTED, as on old drivers)
 *   processes           pid:bytes,pid:bytes...  ('-' for none)
 *                       (nvmlDeviceGetComputeRunningProcesses_v3)
 *   mig.mode            0 or 1 (nvmlDeviceGetMigMode)
 *   nvlinks             number of active NVLink links (nvmlDeviceGetNvLinkState)
 *   lost                1: every call on the GPU (and its MIG devices) returns
 *                       NVML_ERROR_GPU_IS_LOST
 *   xid                 an XID critical error event with this code, delivered once
 *                       through nvmlEventSetWait_v2 when the step is reached
 * A key that is never set for a target answers NVML_ERROR_NOT_SUPPORTED, like a GPU
 * without that feature.
 *
 * Steps
 * -----
 * The scenario starts at step 0. A test moves it with the extra entry point
 * fake_nvml_set_step(step) (reach it with ctypes.CDLL("libnvidia-ml.so.1"), which is
 * the same library pynvml loaded). For a free-running process (an agent loop), set
 * FAKE_NVML_STEP_S=<seconds>: the step is then the number of whole periods since
 * nvmlInitWithFlags. fake_nvml_query_count(key) tells how often a key was asked for,
 * so a test can check that the caller stops asking for an unsupported field.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nvml.h"

#define MAX_GPUS 64
#define MAX_MIG 8
#define MAX_ENTRIES 8192
#define MAX_COUNTED 128

struct nvmlDevice_st {
    int gpu;
    int mig; /* -1: the whole GPU */
    int gi;
    int ci;
    int present;
    char target[16];
};

struct nvmlEventSet_st {
    unsigned long long registered[MAX_GPUS];
};

typedef struct {
    unsigned step;
    char target[16];
    char key[32];
    char value[512];
    int delivered;
} entry_t;

static entry_t *entries;
static int n_entries;
static int n_gpus;
static char driver[80] = "0.0";
static struct nvmlDevice_st gpus[MAX_GPUS];
static struct nvmlDevice_st migs[MAX_GPUS][MAX_MIG];
static struct nvmlEventSet_st event_set;
static int initialised;
static unsigned fixed_step;
static double step_seconds;
static double start_time;
static char counted_key[MAX_COUNTED][32];
static unsigned counted[MAX_COUNTED];
static int n_counted;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static unsigned current_step(void) {
    if (step_seconds > 0) return (unsigned)((now_s() - start_time) / step_seconds);
    return fixed_step;
}

void fake_nvml_set_step(unsigned step) { fixed_step = step; }

unsigned fake_nvml_query_count(const char *key) {
    for (int i = 0; i < n_counted; i++)
        if (strcmp(counted_key[i], key) == 0) return counted[i];
    return 0;
}

static void count(const char *key) {
    for (int i = 0; i < n_counted; i++)
        if (strcmp(counted_key[i], key) == 0) { counted[i]++; return; }
    if (n_counted < MAX_COUNTED) {
        snprintf(counted_key[n_counted], sizeof counted_key[0], "%s", key);
        counted[n_counted++] = 1;
    }
}

/* The value of key for target at the current step, or NULL when never set. */
static const char *lookup(const char *target, const char *key) {
    unsigned step = current_step();
    const entry_t *best = NULL;
    count(key);
    for (int i = 0; i < n_entries; i++) {
        const entry_t *e = &entries[i];
        if (e->step <= step && strcmp(e->target, target) == 0 && strcmp(e->key, key) == 0
            && (best == NULL || e->step >= best->step))
            best = e;
    }
    return best ? best->value : NULL;
}

static int gpu_lost(int gpu) {
    char target[16];
    snprintf(target, sizeof target, "g%d", gpu);
    unsigned step = current_step();
    for (int i = 0; i < n_entries; i++) {
        const entry_t *e = &entries[i];
        if (e->step <= step && strcmp(e->target, target) == 0 && strcmp(e->key, "lost") == 0
            && atoi(e->value) != 0)
            return 1;
    }
    return 0;
}

/* Common checks for a device handle: initialised, valid, not lost. */
static nvmlReturn_t check(nvmlDevice_t device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || !device->present) return NVML_ERROR_INVALID_ARGUMENT;
    if (gpu_lost(device->gpu)) return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

static nvmlReturn_t get_ull(nvmlDevice_t device, const char *key, unsigned long long *out) {
    nvmlReturn_t r = check(device);
    if (r != NVML_SUCCESS) return r;
    const char *v = lookup(device->target, key);
    if (v == NULL) return NVML_ERROR_NOT_SUPPORTED;
    *out = strtoull(v, NULL, 10);
    return NVML_SUCCESS;
}

static nvmlReturn_t get_uint(nvmlDevice_t device, const char *key, unsigned int *out) {
    if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long v = 0;
    nvmlReturn_t r = get_ull(device, key, &v);
    if (r == NVML_SUCCESS) *out = (unsigned int)v;
    return r;
}

static nvmlReturn_t get_str(nvmlDevice_t device, const char *key, char *out, unsigned len) {
    nvmlReturn_t r = check(device);
    if (r != NVML_SUCCESS) return r;
    const char *v = lookup(device->target, key);
    if (v == NULL) return NVML_ERROR_NOT_SUPPORTED;
    if (strlen(v) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, v);
    return NVML_SUCCESS;
}

static void trim(char *s) {
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ')) s[--n] = 0;
}

static int load(const char *path) {
    FILE *f = fopen(path, "r");
    if (f == NULL) return -1;
    free(entries);
    entries = calloc(MAX_ENTRIES, sizeof(entry_t));
    n_entries = 0;
    n_gpus = 0;
    memset(gpus, 0, sizeof gpus);
    memset(migs, 0, sizeof migs);
    memset(&event_set, 0, sizeof event_set);
    char line[1024];
    while (fgets(line, sizeof line, f) != NULL) {
        trim(line);
        char *p = line;
        while (*p == ' ') p++;
        if (*p == 0 || *p == '#') continue;
        int gpu, slot, gi, ci, consumed = 0;
        unsigned step;
        entry_t *e = &entries[n_entries];
        if (strncmp(p, "driver ", 7) == 0) {
            snprintf(driver, sizeof driver, "%s", p + 7);
        } else if (sscanf(p, "gpus %d", &gpu) == 1) {
            n_gpus = gpu < MAX_GPUS ? gpu : MAX_GPUS;
        } else if (sscanf(p, "mig %d %d %d %d", &gpu, &slot, &gi, &ci) == 4) {
            if (gpu < 0 || gpu >= MAX_GPUS || slot < 0 || slot >= MAX_MIG) continue;
            struct nvmlDevice_st *m = &migs[gpu][slot];
            m->gpu = gpu; m->mig = slot; m->gi = gi; m->ci = ci; m->present = 1;
            snprintf(m->target, sizeof m->target, "g%d.m%d", gpu, slot);
        } else if (n_entries < MAX_ENTRIES
                   && sscanf(p, "at %u %15s %31s %n", &step, e->target, e->key, &consumed) == 3
                   && consumed > 0) {
            e->step = step;
            snprintf(e->value, sizeof e->value, "%s", p + consumed);
            n_entries++;
        } else {
            fprintf(stderr, "fake_nvml: %s: cannot read line: %s\n", path, p);
        }
    }
    fclose(f);
    for (int i = 0; i < n_gpus; i++) {
        gpus[i].gpu = i; gpus[i].mig = -1; gpus[i].present = 1;
        snprintf(gpus[i].target, sizeof gpus[i].target, "g%d", i);
    }
    return 0;
}

/* ---- NVML entry points ---------------------------------------------------------- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    const char *path = getenv("FAKE_NVML_SCENARIO");
    if (path == NULL || load(path) != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    const char *period = getenv("FAKE_NVML_STEP_S");
    step_seconds = period ? atof(period) : 0.0;
    start_time = now_s();
    initialised = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    initialised = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (version == NULL || strlen(driver) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(version, driver);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    *deviceCount = (unsigned int)n_gpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (index >= (unsigned int)n_gpus || device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (gpu_lost((int)index)) return NVML_ERROR_GPU_IS_LOST;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    return get_str(device, "uuid", uuid, length);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    return get_str(device, "name", name, length);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    unsigned long long total = 0, used = 0;
    nvmlReturn_t r = get_ull(device, "mem.total", &total);
    if (r == NVML_SUCCESS) r = get_ull(device, "mem.used", &used);
    if (r != NVML_SUCCESS) return r;
    memory->total = total;
    memory->used = used;
    memory->free = total > used ? total - used : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    unsigned int gpu = 0, mem = 0;
    nvmlReturn_t r = get_uint(device, "util.gpu", &gpu);
    if (r == NVML_SUCCESS) r = get_uint(device, "util.mem", &mem);
    if (r != NVML_SUCCESS) return r;
    utilization->gpu = gpu;
    utilization->memory = mem;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    return get_uint(device, "power", power);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                      unsigned int *temp) {
    if (sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    return get_uint(device, "temp", temp);
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                    unsigned int *clock) {
    if (type != NVML_CLOCK_SM) return NVML_ERROR_NOT_SUPPORTED;
    return get_uint(device, "clock.sm", clock);
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter,
                                         unsigned int *value) {
    if (counter == NVML_PCIE_UTIL_TX_BYTES) return get_uint(device, "pcie.tx", value);
    if (counter == NVML_PCIE_UTIL_RX_BYTES) return get_uint(device, "pcie.rx", value);
    return NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                      nvmlFieldValue_t *values) {
    nvmlReturn_t r = check(device);
    if (r != NVML_SUCCESS) return r;
    const char *error = lookup(device->target, "fieldvalues.error");
    if (error != NULL) return (nvmlReturn_t)atoi(error);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    for (int i = 0; i < valuesCount; i++) {
        char key[32];
        snprintf(key, sizeof key, "field.%u", values[i].fieldId);
        const char *v = lookup(device->target, key);
        values[i].timestamp = (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
        values[i].latencyUsec = 0;
        if (v == NULL) {
            values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            continue;
        }
        values[i].nvmlReturn = NVML_SUCCESS;
        values[i].valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        values[i].value.ullVal = strtoull(v, NULL, 10);
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos) {
    nvmlReturn_t r = check(device);
    if (r != NVML_SUCCESS) return r;
    const char *v = lookup(device->target, "processes");
    if (v == NULL) return NVML_ERROR_NOT_SUPPORTED;
    unsigned int n = 0;
    nvmlProcessInfo_t found[256];
    const char *p = v;
    while (*p && *p != '-' && n < 256) {
        unsigned int pid = 0;
        unsigned long long bytes = 0;
        int used = 0;
        if (sscanf(p, "%u:%llu%n", &pid, &bytes, &used) != 2) break;
        found[n].pid = pid;
        found[n].usedGpuMemory = bytes;
        found[n].gpuInstanceId = device->mig >= 0 ? (unsigned int)device->gi : 0xFFFFFFFFu;
        found[n].computeInstanceId = device->mig >= 0 ? (unsigned int)device->ci : 0xFFFFFFFFu;
        n++;
        p += used;
        if (*p == ',') p++;
    }
    if (n == 0) {
        *infoCount = 0;
        return NVML_SUCCESS;
    }
    if (infos == NULL || *infoCount < n) {
        *infoCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(infos, found, n * sizeof(nvmlProcessInfo_t));
    *infoCount = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                  unsigned int *pendingMode) {
    unsigned int mode = 0;
    nvmlReturn_t r = get_uint(device, "mig.mode", &mode);
    if (r != NVML_SUCCESS) return r;
    *currentMode = mode;
    *pendingMode = mode;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    unsigned int mode = 0;
    nvmlReturn_t r = get_uint(device, "mig.mode", &mode);
    if (r != NVML_SUCCESS) return r;
    *count = MAX_MIG;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                 nvmlDevice_t *migDevice) {
    nvmlReturn_t r = check(device);
    if (r != NVML_SUCCESS) return r;
    if (device->mig >= 0 || index >= MAX_MIG) return NVML_ERROR_INVALID_ARGUMENT;
    if (!migs[device->gpu][index].present) return NVML_ERROR_NOT_FOUND;
    *migDevice = &migs[device->gpu][index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    nvmlReturn_t r = check(device);
    if (r != NVML_SUCCESS) return r;
    if (device->mig < 0) return NVML_ERROR_NOT_SUPPORTED;
    *id = (unsigned int)device->gi;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    nvmlReturn_t r = check(device);
    if (r != NVML_SUCCESS) return r;
    if (device->mig < 0) return NVML_ERROR_NOT_SUPPORTED;
    *id = (unsigned int)device->ci;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                      nvmlEnableState_t *isActive) {
    unsigned int links = 0;
    nvmlReturn_t r = get_uint(device, "nvlinks", &links);
    if (r != NVML_SUCCESS) return r;
    if (link >= NVML_NVLINK_MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    *isActive = link < links ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    memset(&event_set, 0, sizeof event_set);
    *set = &event_set;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                      nvmlEventSet_t set) {
    nvmlReturn_t r = check(device);
    if (r != NVML_SUCCESS) return r;
    if (device->mig >= 0 || set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    set->registered[device->gpu] |= eventTypes;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                 unsigned int timeoutms) {
    (void)timeoutms; /* never blocks: the events of the current step or none */
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    unsigned step = current_step();
    for (int i = 0; i < n_entries; i++) {
        entry_t *e = &entries[i];
        int gpu = -1;
        if (e->delivered || e->step > step || strcmp(e->key, "xid") != 0) continue;
        if (sscanf(e->target, "g%d", &gpu) != 1 || gpu < 0 || gpu >= n_gpus) continue;
        if (!(set->registered[gpu] & nvmlEventTypeXidCriticalError)) continue;
        e->delivered = 1;
        data->device = &gpus[gpu];
        data->eventType = nvmlEventTypeXidCriticalError;
        data->eventData = strtoull(e->value, NULL, 10);
        data->gpuInstanceId = 0xFFFFFFFFu;
        data->computeInstanceId = 0xFFFFFFFFu;
        return NVML_SUCCESS;
    }
    return NVML_ERROR_TIMEOUT;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    memset(set, 0, sizeof *set);
    return NVML_SUCCESS;
}
