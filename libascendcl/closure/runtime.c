/*
 * runtime.c: libruntime.so, the rt* functions of CANN's runtime that torch_npu links. Kernel binaries go
 * through libascendcl.so's binary calls (shipped once to the aclserver, which forwards them to the host's CANN
 * on the ascend backend and answers 200001 on the emulated one): rtDevBinaryRegister loads one
 * (aclrtBinaryLoadFromData), rtFunctionRegister looks its kernel up (aclrtBinaryGetFunction) under the stub
 * the program launches it by, rtKernelLaunch launches it (aclrtLaunchKernel, arguments by value).
 * rtGetC2cCtrlAddr answers no control address (0, length 0), as a die without C2C. Prototypes as CANN's
 * rt headers (rtError_t is int32_t).
 */
#include "closure.h"

#include <pthread.h>
#include <stdint.h>

typedef int32_t rtError_t;
typedef void *rtStream_t;
typedef struct tagRtDevBinary {
    uint32_t magic;
    uint32_t version;
    const void *data;
    uint64_t length;
} rtDevBinary_t;
typedef struct rtSmDesc rtSmDesc_t;

#define RT_PARAM_INVALID 107000
#define RT_FEATURE_NOT_SUPPORT 207000
#define MAX_STUBS 4096

API rtError_t rtGetC2cCtrlAddr(uint64_t *addr, uint32_t *len);
API rtError_t rtDevBinaryRegister(const rtDevBinary_t *bin, void **hdl);
API rtError_t rtFunctionRegister(void *binHandle, const void *stubFunc, const char *stubName,
                                 const void *kernelInfoExt, uint32_t funcMode);
API rtError_t rtKernelLaunch(const void *stubFunc, uint32_t blockDim, void *args, uint32_t argsSize,
                             rtSmDesc_t *smDesc, rtStream_t stm);

typedef int (*load_fn)(const void *, size_t, const void *, void **);
typedef int (*lookup_fn)(const void *, const char *, void **);
typedef int (*launch_fn)(void *, uint32_t, const void *, size_t, void *);

static struct {
    const void *stub;
    void *func;
} stubs[MAX_STUBS];
static pthread_mutex_t stubs_lock = PTHREAD_MUTEX_INITIALIZER;

API rtError_t rtGetC2cCtrlAddr(uint64_t *addr, uint32_t *len)
{
    if (addr)
        *addr = 0;
    if (len)
        *len = 0;
    return 0;
}

API rtError_t rtDevBinaryRegister(const rtDevBinary_t *bin, void **hdl)
{
    if (!bin || !bin->data || !bin->length || !hdl)
        return RT_PARAM_INVALID;
    load_fn load;
    *(void **)&load = closure_lookup("aclrtBinaryLoadFromData");
    return load ? load(bin->data, (size_t)bin->length, NULL, hdl) : RT_FEATURE_NOT_SUPPORT;
}

API rtError_t rtFunctionRegister(void *binHandle, const void *stubFunc, const char *stubName,
                                 const void *kernelInfoExt, uint32_t funcMode)
{
    (void)funcMode;
    const char *kernel = kernelInfoExt ? (const char *)kernelInfoExt : stubName;
    if (!binHandle || !stubFunc || !kernel)
        return RT_PARAM_INVALID;
    lookup_fn lookup;
    *(void **)&lookup = closure_lookup("aclrtBinaryGetFunction");
    void *func = NULL;
    int rc = lookup ? lookup(binHandle, kernel, &func) : RT_FEATURE_NOT_SUPPORT;
    if (rc)
        return rc;
    pthread_mutex_lock(&stubs_lock);
    int i = 0;
    while (i < MAX_STUBS && stubs[i].stub && stubs[i].stub != stubFunc)
        i++;
    if (i < MAX_STUBS)
        stubs[i].stub = stubFunc, stubs[i].func = func;
    pthread_mutex_unlock(&stubs_lock);
    return i < MAX_STUBS ? 0 : RT_PARAM_INVALID;
}

API rtError_t rtKernelLaunch(const void *stubFunc, uint32_t blockDim, void *args, uint32_t argsSize,
                             rtSmDesc_t *smDesc, rtStream_t stm)
{
    (void)smDesc;
    void *func = NULL;
    pthread_mutex_lock(&stubs_lock);
    for (int i = 0; i < MAX_STUBS && stubs[i].stub && !func; i++)
        if (stubs[i].stub == stubFunc)
            func = stubs[i].func;
    pthread_mutex_unlock(&stubs_lock);
    if (!func) {
        fprintf(stderr, "FlexNPU client: rtKernelLaunch: the stub %p was not registered (rtFunctionRegister)\n",
                stubFunc);
        return RT_PARAM_INVALID;
    }
    launch_fn launch;
    *(void **)&launch = closure_lookup("aclrtLaunchKernel");
    return launch ? launch(func, blockDim, args, argsSize, stm) : RT_FEATURE_NOT_SUPPORT;
}
