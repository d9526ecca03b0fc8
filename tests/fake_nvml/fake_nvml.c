/* A stand-in for libnvidia-ml.so.1, written against NVML's own header (nvml.h from PyPI's nvidia-nvml-dev), so that
 * the real nvidia-ml-py loads it and the probe runs through the same ctypes calls as on a GPU host. A definition whose
 * signature differs from nvml.h's declaration does not compile.
 *
 * It answers from a KEY=VALUE file named by FAKE_NVML_FACTS, which the tests write from a real recording: global keys
 * (count, driver_version, cuda_driver_version) and per-GPU keys "<index>.<field>". A field the file lacks is a field
 * the GPU does not support: the call returns NVML_ERROR_NOT_SUPPORTED, as the real library does. A global key
 * init_error makes nvmlInit return that code, as the real library does when the kernel module refuses it (18,
 * NVML_ERROR_LIB_RM_VERSION_MISMATCH: the module is another driver version).
 *
 * Compiled with -DFAKE_NVML_R470 or -DFAKE_NVML_R535 it exports what those drivers' libraries export, as the NVML
 * headers of their CUDA releases declare it (NVIDIA/go-nvml's pkg/nvml/nvml.h history: 11.4 at 1e34b77 for R470,
 * 12.2 at 075f45f for R535): R470 lacks nvmlDeviceGetCurrentClocksEventReasons (12.2 renamed
 * nvmlDeviceGetCurrentClocksThrottleReasons), nvmlDeviceGetGpuFabricInfo and nvmlDeviceGetGpuMaxPcieLinkGeneration
 * (both 12.0); neither has nvmlDeviceGetGpuFabricInfoV (12.4) nor the field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (13.0).
 */
#if defined(FAKE_NVML_R470)
#define FAKE_NVML_WITHOUT_FABRIC_V
#define FAKE_NVML_FI_MAX 161 /* NVML_FI_MAX of nvml.h 11.4 */
#elif defined(FAKE_NVML_R535)
#define FAKE_NVML_WITHOUT_FABRIC_V
#define FAKE_NVML_FI_MAX 197 /* NVML_FI_MAX of nvml.h 12.2 */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include "nvml.h"

#define MAX_ENTRIES 1024
#define MAX_LINE 512

static char keys[MAX_ENTRIES][64];
static char values[MAX_ENTRIES][MAX_LINE];
static int entries = -1;

static nvmlReturn_t load(void)
{
    const char *path = getenv("FAKE_NVML_FACTS");
    char line[MAX_LINE + 64];
    FILE *f;
    if (entries >= 0)
        return NVML_SUCCESS;
    if (path == NULL || (f = fopen(path, "r")) == NULL)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    entries = 0;
    while (entries < MAX_ENTRIES && fgets(line, sizeof line, f) != NULL) {
        char *eq = strchr(line, '=');
        size_t end = strcspn(line, "\r\n");
        line[end] = '\0';
        if (eq == NULL || (size_t)(eq - line) >= sizeof keys[0])
            continue;
        *eq = '\0';
        memcpy(keys[entries], line, (size_t)(eq - line) + 1);
        strncpy(values[entries], eq + 1, sizeof values[0] - 1);
        entries++;
    }
    fclose(f);
    return NVML_SUCCESS;
}

static const char *global(const char *key)
{
    int i;
    for (i = 0; i < entries; i++)
        if (strcmp(keys[i], key) == 0)
            return values[i];
    return NULL;
}

/* A device handle is its index plus one, so that no handle is NULL. */
static int device_index(nvmlDevice_t device)
{
    const char *count = global("count");
    intptr_t index = (intptr_t)device - 1;
    if (device == NULL || count == NULL || index < 0 || index >= atoi(count))
        return -1;
    return (int)index;
}

static const char *field(nvmlDevice_t device, const char *name)
{
    char key[64];
    int index = device_index(device);
    if (index < 0)
        return NULL;
    snprintf(key, sizeof key, "%d.%s", index, name);
    return global(key);
}

/* The i-th space-separated number of a value. */
static unsigned long long nth(const char *value, int i)
{
    char *end;
    unsigned long long number = strtoull(value, &end, 0);
    while (i-- > 0)
        number = strtoull(end, &end, 0);
    return number;
}

#define FIELD_OR_NOT_SUPPORTED(device, name, out) \
    const char *out = field(device, name); \
    if (device_index(device) < 0) return NVML_ERROR_INVALID_ARGUMENT; \
    if (out == NULL) return NVML_ERROR_NOT_SUPPORTED;

static nvmlReturn_t copy_text(const char *text, char *buffer, unsigned int length)
{
    if (buffer == NULL || strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buffer, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

static nvmlReturn_t text_field(nvmlDevice_t device, const char *name, char *buffer, unsigned int length)
{
    FIELD_OR_NOT_SUPPORTED(device, name, value)
    return copy_text(value, buffer, length);
}

static nvmlReturn_t unsigned_field(nvmlDevice_t device, const char *name, int position, unsigned int *out)
{
    FIELD_OR_NOT_SUPPORTED(device, name, value)
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *out = (unsigned int)nth(value, position);
    return NVML_SUCCESS;
}

static nvmlReturn_t init(void)
{
    nvmlReturn_t loaded = load();
    const char *refused = global("init_error");
    if (loaded != NVML_SUCCESS || refused == NULL)
        return loaded;
    return (nvmlReturn_t)atoi(refused);
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return init();
}

nvmlReturn_t nvmlInit(void) { return init(); }

nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    /* libnvidia-ml.so.535.261.03's own text (tests/data/messages/nvidia-driver-libraries.yaml) */
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "Driver/library version mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    const char *value = global("driver_version");
    return value == NULL ? NVML_ERROR_NOT_SUPPORTED : copy_text(value, version, length);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    const char *value = global("cuda_driver_version");
    if (value == NULL)
        return NVML_ERROR_NOT_SUPPORTED;
    *cudaDriverVersion = atoi(value);
    return NVML_SUCCESS;
}

/* "process.<pid>" names a process (nvidia-smi's process_name). */
nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    char key[32];
    const char *value;
    snprintf(key, sizeof key, "process.%u", pid);
    value = global(key);
    return value == NULL ? NVML_ERROR_NOT_FOUND : copy_text(value, name, length);
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    const char *count = global("count");
    if (count == NULL)
        return NVML_ERROR_UNINITIALIZED;
    *deviceCount = (unsigned int)atoi(count);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    nvmlDevice_t handle = (nvmlDevice_t)(intptr_t)(index + 1);
    if (device_index(handle) < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = handle;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    return text_field(device, "name", name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    return text_field(device, "uuid", uuid, length);
}

nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    FIELD_OR_NOT_SUPPORTED(device, "pci_bus_id", value)
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", value);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", value);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    FIELD_OR_NOT_SUPPORTED(device, "memory", value)  /* total used */
    memory->total = nth(value, 0);
    memory->used = nth(value, 1);
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    FIELD_OR_NOT_SUPPORTED(device, "memory", value)
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = nth(value, 0);
    memory->used = nth(value, 1);
    memory->reserved = 0;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current, nvmlEnableState_t *pending)
{
    FIELD_OR_NOT_SUPPORTED(device, "ecc_mode", value)  /* current pending */
    *current = (nvmlEnableState_t)nth(value, 0);
    *pending = (nvmlEnableState_t)nth(value, 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType, nvmlEccCounterType_t counterType,
                                         unsigned long long *eccCounts)
{
    FIELD_OR_NOT_SUPPORTED(device, "ecc_uncorrected", value)  /* volatile aggregate */
    if (errorType != NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        return NVML_ERROR_NOT_SUPPORTED;
    *eccCounts = nth(value, counterType == NVML_VOLATILE_ECC ? 0 : 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows, unsigned int *isPending,
                                       unsigned int *failureOccurred)
{
    FIELD_OR_NOT_SUPPORTED(device, "remapped_rows", value)  /* correctable uncorrectable pending failure */
    *corrRows = (unsigned int)nth(value, 0);
    *uncRows = (unsigned int)nth(value, 1);
    *isPending = (unsigned int)nth(value, 2);
    *failureOccurred = (unsigned int)nth(value, 3);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending)
{
    FIELD_OR_NOT_SUPPORTED(device, "retired_pages_pending", value)
    *isPending = (nvmlEnableState_t)nth(value, 0);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    FIELD_OR_NOT_SUPPORTED(device, "mig_mode", value)  /* current pending */
    *currentMode = (unsigned int)nth(value, 0);
    *pendingMode = (unsigned int)nth(value, 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    unsigned int state;
    nvmlReturn_t result = unsigned_field(device, "persistence_mode", 0, &state);
    *mode = (nvmlEnableState_t)state;
    return result;
}

nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode)
{
    unsigned int value;
    nvmlReturn_t result = unsigned_field(device, "compute_mode", 0, &value);
    *mode = (nvmlComputeMode_t)value;
    return result;
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *currLinkGen)
{
    return unsigned_field(device, "pcie_gen", 0, currLinkGen);  /* current max gpu_max */
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *maxLinkGen)
{
    return unsigned_field(device, "pcie_gen", 1, maxLinkGen);
}

#ifndef FAKE_NVML_R470
nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *maxLinkGenDevice)
{
    return unsigned_field(device, "pcie_gen", 2, maxLinkGenDevice);
}
#endif

nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *currLinkWidth)
{
    return unsigned_field(device, "pcie_width", 0, currLinkWidth);  /* current max */
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *maxLinkWidth)
{
    return unsigned_field(device, "pcie_width", 1, maxLinkWidth);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp)
{
    if (sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_NOT_SUPPORTED;
    return unsigned_field(device, "temperature_c", 0, temp);
}

#ifndef FAKE_NVML_R470
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *clocksEventReasons)
{
    FIELD_OR_NOT_SUPPORTED(device, "clocks_event_reasons", value)
    *clocksEventReasons = nth(value, 0);
    return NVML_SUCCESS;
}
#endif

/* The older name, deprecated in nvml.h 13.0 but still declared there; the real 580.159.04 library on a lent H100
 * (2026-11-27) exports it and answered it as the new name (1, GPU idle, both). */
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *clocksThrottleReasons)
{
    FIELD_OR_NOT_SUPPORTED(device, "clocks_event_reasons", value)
    *clocksThrottleReasons = nth(value, 0);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char *version, unsigned int length)
{
    return text_field(device, "vbios_version", version, length);
}

nvmlReturn_t nvmlDeviceGetInforomImageVersion(nvmlDevice_t device, char *version, unsigned int length)
{
    return text_field(device, "inforom_image_version", version, length);
}

/* "<index>.processes" lists a GPU's compute processes as "pid:used_bytes" words; none when absent. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos)
{
    const char *value = field(device, "processes");
    unsigned int count = 0, i;
    const char *cursor;
    if (device_index(device) < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (cursor = value; cursor != NULL && *cursor; cursor += strspn(cursor, " ")) {
        count++;
        cursor += strcspn(cursor, " ");
    }
    if (count > *infoCount || (count > 0 && infos == NULL)) {
        *infoCount = count;  /* as the real library: the size needed, and INSUFFICIENT_SIZE */
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *infoCount = count;
    for (cursor = value, i = 0; i < count; i++) {
        char *end;
        cursor += strspn(cursor, " ");
        infos[i].pid = (unsigned int)strtoul(cursor, &end, 10);
        infos[i].usedGpuMemory = strtoull(end + 1, &end, 10);
        infos[i].gpuInstanceId = 0xFFFFFFFF;  /* no MIG */
        infos[i].computeInstanceId = 0xFFFFFFFF;
        cursor = end;
    }
    return NVML_SUCCESS;
}

/* The fabric fields: state status clique_id, then the cluster UUID (32 hex digits) and the health summary. */
/* Unused in the R470 build, whose library has neither fabric call. */
__attribute__((unused)) static nvmlReturn_t fabric(nvmlDevice_t device, unsigned char *uuid, nvmlReturn_t *status, unsigned int *clique,
                           nvmlGpuFabricState_t *state, unsigned char *health)
{
    const char *hex;
    int i;
    FIELD_OR_NOT_SUPPORTED(device, "fabric", value)
    *state = (nvmlGpuFabricState_t)nth(value, 0);
    *status = (nvmlReturn_t)nth(value, 1);
    *clique = (unsigned int)nth(value, 2);
    hex = field(device, "fabric_cluster_uuid");
    for (i = 0; i < NVML_GPU_FABRIC_UUID_LEN; i++) {
        unsigned int byte = 0;
        if (hex != NULL && strlen(hex) >= 2 * (size_t)(i + 1))
            sscanf(hex + 2 * i, "%2x", &byte);
        uuid[i] = (unsigned char)byte;
    }
    if (health != NULL)
        *health = (unsigned char)nth(value, 3);
    return NVML_SUCCESS;
}

#ifndef FAKE_NVML_R470
nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *gpuFabricInfo)
{
    return fabric(device, gpuFabricInfo->clusterUuid, &gpuFabricInfo->status, &gpuFabricInfo->cliqueId, &gpuFabricInfo->state, NULL);
}
#endif

/* Compiled with -DFAKE_NVML_WITHOUT_FABRIC_V, the library lacks the versioned call, as older drivers' libraries do. */
#ifndef FAKE_NVML_WITHOUT_FABRIC_V
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *gpuFabricInfo)
{
    /* Version 2 lacks the health summary at the end; the real library takes both. */
    if (gpuFabricInfo->version == nvmlGpuFabricInfo_v3) {
        return fabric(device, gpuFabricInfo->clusterUuid, &gpuFabricInfo->status, &gpuFabricInfo->cliqueId,
                      &gpuFabricInfo->state, &gpuFabricInfo->healthSummary);
    }
    if (gpuFabricInfo->version == nvmlGpuFabricInfo_v2) {
        return fabric(device, gpuFabricInfo->clusterUuid, &gpuFabricInfo->status, &gpuFabricInfo->cliqueId,
                      &gpuFabricInfo->state, NULL);
    }
    return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
}
#endif

/* NVLink: "<index>.nvlinks" is one word per link, 1 active or 0 down; "<index>.nvlink<N>.errors" the four DL error
 * counters (replay recovery crc_flit crc_data). */
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive)
{
    const char *value;
    const char *cursor;
    unsigned int i;
    FIELD_OR_NOT_SUPPORTED(device, "nvlinks", links)
    value = links;
    for (cursor = value, i = 0; i < link && *cursor; i++) {
        cursor += strcspn(cursor, " ");
        cursor += strspn(cursor, " ");
    }
    if (*cursor == '\0')
        return NVML_ERROR_INVALID_ARGUMENT;
    *isActive = (nvmlEnableState_t)(*cursor == '1');
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link, nvmlNvLinkErrorCounter_t counter,
                                             unsigned long long *counterValue)
{
    char name[32];
    const char *value;
    snprintf(name, sizeof name, "nvlink%u.errors", link);
    value = field(device, name);
    if (value == NULL)
        return NVML_ERROR_NOT_SUPPORTED;
    *counterValue = nth(value, (int)counter);
    return NVML_SUCCESS;
}

/* Field values: "<index>.field<ID>" holds an unsigned value; a field the file lacks is Not Supported for that entry. */
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values)
{
    int i;
    if (device_index(device) < 0 || valuesCount < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (i = 0; i < valuesCount; i++) {
        char name[32];
        const char *value;
        snprintf(name, sizeof name, "field%u", values[i].fieldId);
        value = field(device, name);
#ifdef FAKE_NVML_FI_MAX
        /* A field id past the generation's NVML_FI_MAX is one its driver does not know. nvml.h says only that each
         * value's nvmlReturn tells; Not Supported there is our reading, not a recorded answer. */
        if (values[i].fieldId >= FAKE_NVML_FI_MAX)
            value = NULL;
#endif
        values[i].timestamp = 0;
        values[i].latencyUsec = 0;
        values[i].valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        values[i].nvmlReturn = value == NULL ? NVML_ERROR_NOT_SUPPORTED : NVML_SUCCESS;
        values[i].value.uiVal = value == NULL ? 0 : (unsigned int)nth(value, 0);
    }
    return NVML_SUCCESS;
}
