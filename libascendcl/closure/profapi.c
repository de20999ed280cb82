/*
 * profapi.c: libprofapi.so, CANN's profiling entry points that torch_npu links. A share collects
 * no profiling data: reports are accepted and dropped, callbacks are never called, hashes are
 * stable (FNV-1a of the bytes) and the cycle time is CLOCK_MONOTONIC in nanoseconds.
 * Prototypes as CANN's prof_api.h.
 */
#include "closure.h"

#include <stddef.h>
#include <stdint.h>
#include <time.h>

struct MsprofApi;
typedef int32_t (*ProfCommandHandle)(uint32_t type, void *data, uint32_t len);

API uint64_t MsprofSysCycleTime(void);
API uint64_t MsprofGetHashId(const char *hashInfo, size_t length);
API int32_t MsprofReportApi(uint32_t agingFlag, const struct MsprofApi *api);
API int32_t MsprofReportCompactInfo(uint32_t agingFlag, const void *data, uint32_t length);
API int32_t MsprofReportAdditionalInfo(uint32_t agingFlag, const void *data, uint32_t length);
API int32_t MsprofRegisterCallback(uint32_t moduleId, ProfCommandHandle handle);

API uint64_t MsprofSysCycleTime(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

API uint64_t MsprofGetHashId(const char *hashInfo, size_t length)
{
    uint64_t h = 14695981039346656037u;
    for (size_t i = 0; hashInfo && i < length; i++) {
        h ^= (unsigned char)hashInfo[i];
        h *= 1099511628211u;
    }
    return h;
}

API int32_t MsprofReportApi(uint32_t agingFlag, const struct MsprofApi *api)
{
    (void)agingFlag, (void)api;
    return 0;
}

API int32_t MsprofReportCompactInfo(uint32_t agingFlag, const void *data, uint32_t length)
{
    (void)agingFlag, (void)data, (void)length;
    return 0;
}

API int32_t MsprofReportAdditionalInfo(uint32_t agingFlag, const void *data, uint32_t length)
{
    (void)agingFlag, (void)data, (void)length;
    return 0;
}

API int32_t MsprofRegisterCallback(uint32_t moduleId, ProfCommandHandle handle)
{
    (void)moduleId, (void)handle;
    return 0;
}
