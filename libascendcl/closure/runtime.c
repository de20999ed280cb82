/*
 * runtime.c: libruntime.so, the rt* functions of CANN's runtime that torch_npu links. A share runs
 * no kernel binary on the emulated backend: registering or launching one answers
 * ACL_ERROR_RT_FEATURE_NOT_SUPPORT (207000) with a message on stderr naming the call, once per
 * process; rtGetC2cCtrlAddr answers no control address (0, length 0), as a die without C2C.
 * Prototypes as CANN's rt headers (rtError_t is int32_t).
 */
#include "closure.h"

#include <stdint.h>

typedef int32_t rtError_t;
typedef void *rtStream_t;
typedef struct rtDevBinary rtDevBinary_t;
typedef struct rtSmDesc rtSmDesc_t;

#define RT_FEATURE_NOT_SUPPORT 207000

API rtError_t rtGetC2cCtrlAddr(uint64_t *addr, uint32_t *len);
API rtError_t rtDevBinaryRegister(const rtDevBinary_t *bin, void **hdl);
API rtError_t rtFunctionRegister(void *binHandle, const void *stubFunc, const char *stubName,
                                 const void *kernelInfoExt, uint32_t funcMode);
API rtError_t rtKernelLaunch(const void *stubFunc, uint32_t blockDim, void *args, uint32_t argsSize,
                             rtSmDesc_t *smDesc, rtStream_t stm);

static rtError_t unsupported(const char *what)
{
    static int said;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        fprintf(stderr,
                "FlexNPU client: %s: kernel binaries do not run on a FlexNPU vNPU share's emulated backend "
                "(207000)\n",
                what);
    return RT_FEATURE_NOT_SUPPORT;
}

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
    (void)bin;
    if (hdl)
        *hdl = NULL;
    return unsupported("rtDevBinaryRegister");
}

API rtError_t rtFunctionRegister(void *binHandle, const void *stubFunc, const char *stubName,
                                 const void *kernelInfoExt, uint32_t funcMode)
{
    (void)binHandle, (void)stubFunc, (void)stubName, (void)kernelInfoExt, (void)funcMode;
    return unsupported("rtFunctionRegister");
}

API rtError_t rtKernelLaunch(const void *stubFunc, uint32_t blockDim, void *args, uint32_t argsSize,
                             rtSmDesc_t *smDesc, rtStream_t stm)
{
    (void)stubFunc, (void)blockDim, (void)args, (void)argsSize, (void)smDesc, (void)stm;
    return unsupported("rtKernelLaunch");
}
