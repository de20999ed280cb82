/*
 * stub_ascendcl.c: a stand-in for CANN's libascendcl.so in an application image. It has the
 * SONAME and the symbols an application links against; every call fails with ACL_ERROR_FAILURE
 * (500001) and the message "stub CANN library". The e2e tests link an "unmodified" program
 * against it (as if built on a CANN machine) and check that FlexNPU's shim, not this, serves it.
 */
#include <stddef.h>

#define EXPORT __attribute__((visibility("default")))
#define STUB(name)                                                                                              \
    EXPORT int name(void);                                                                                      \
    EXPORT int name(void)                                                                                       \
    {                                                                                                           \
        return 500001;                                                                                          \
    }

STUB(aclInit)
STUB(aclFinalize)
STUB(aclrtSetDevice)
STUB(aclrtResetDevice)
STUB(aclrtGetDeviceCount)
STUB(aclrtGetMemInfo)
STUB(aclrtMalloc)
STUB(aclrtFree)
STUB(aclrtMallocHost)
STUB(aclrtFreeHost)
STUB(aclrtMemcpy)

EXPORT const char *aclGetRecentErrMsg(void);
EXPORT const char *aclGetRecentErrMsg(void)
{
    return "stub CANN library";
}
