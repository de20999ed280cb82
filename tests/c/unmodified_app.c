/*
 * unmodified_app.c: an ACL application as a user would write it against CANN's headers. It
 * includes no FlexNPU header (it declares the ACL functions it uses, with CANN's signatures) and
 * is linked with -lascendcl against a stub library, not FlexNPU's. Usage:
 * unmodified_app <quota_bytes> <devices>. Prints "val" lines (including which file provides
 * aclInit) and exits with the number of failed checks.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int aclError;
aclError aclInit(const char *configPath);
aclError aclFinalize(void);
aclError aclrtSetDevice(int32_t deviceId);
aclError aclrtGetDeviceCount(uint32_t *count);
aclError aclrtGetMemInfo(int attr, size_t *free, size_t *total);
aclError aclrtMalloc(void **devPtr, size_t size, int policy);
aclError aclrtFree(void *devPtr);
aclError aclrtMallocHost(void **hostPtr, size_t size);
aclError aclrtFreeHost(void *hostPtr);
aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, int kind);
const char *aclGetRecentErrMsg(void);

static int failures;
#define CHECK(cond, what)                                                                                        \
    do {                                                                                                         \
        int ok_ = (cond);                                                                                        \
        const char *m_ = ok_ ? "" : aclGetRecentErrMsg();                                                        \
        printf("%s %s %s\n", ok_ ? "ok" : "FAIL", what, m_ ? m_ : "");                                          \
        failures += !ok_;                                                                                        \
    } while (0)

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    size_t quota = strtoull(argv[1], NULL, 10);
    uint32_t want = (uint32_t)strtoul(argv[2], NULL, 10);
    Dl_info info;
    if (dladdr((void *)aclInit, &info) && info.dli_fname)
        printf("val provider %s\n", info.dli_fname);
    CHECK(aclInit(NULL) == 0, "aclInit");
    uint32_t count = 0;
    CHECK(aclrtGetDeviceCount(&count) == 0 && count == want, "device count");
    printf("val device_count %u\n", count);
    CHECK(aclrtSetDevice(0) == 0, "aclrtSetDevice");
    size_t free_b = 0, total = 0;
    CHECK(aclrtGetMemInfo(1, &free_b, &total) == 0 && total == quota, "mem info total is the quota");
    printf("val total %zu\n", total);
    void *dev = NULL, *more = NULL;
    CHECK(aclrtMalloc(&dev, quota / 2, 0) == 0, "malloc within the quota");
    int rc = aclrtMalloc(&more, quota, 0);
    const char *m = aclGetRecentErrMsg();
    printf("val over_quota_code %d\nval over_quota_msg %s\n", rc, m ? m : "");
    CHECK(rc == 207001, "malloc beyond the quota refused");
    size_t n = 5 << 20;
    unsigned char *host = NULL, *plain = malloc(n);
    CHECK(aclrtMallocHost((void **)&host, n) == 0, "malloc host");
    if (host) {
        for (size_t i = 0; i < n; i++)
            host[i] = (unsigned char)(i * 13 + 1);
        CHECK(aclrtMemcpy(dev, quota / 2, host, n, 1) == 0, "copy host buffer to device");
        CHECK(aclrtMemcpy(plain, n, dev, n, 2) == 0, "copy device to plain memory");
        CHECK(memcmp(host, plain, n) == 0, "content intact");
        aclrtFreeHost(host);
    }
    free(plain);
    CHECK(aclrtFree(dev) == 0, "free");
    CHECK(aclFinalize() == 0, "aclFinalize");
    printf("failures %d\n", failures);
    return failures;
}
