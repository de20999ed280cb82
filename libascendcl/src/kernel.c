/*
 * kernel.c: kernel launch. On a FlexNPU share the only kernel is the emulated backend's
 * (acl/flexnpu_kernel.h): its arguments go to the aclserver, which runs it in stream order under
 * the share's compute policy.
 */
#include "client.h"

#include "acl/acl.h"
#include "acl/flexnpu_kernel.h"

#include <string.h>

static int do_launch(aclrtFuncHandle func, const void *args, size_t args_size, aclrtStream stream)
{
    if (func)
        return flexnpu_fail(ACL_ERROR_API_NOT_SUPPORT,
                            "aclrtLaunchKernel: only the emulated kernel exists on a FlexNPU share (pass funcHandle "
                            "NULL and aclrtEmulatedKernelArgs)");
    if (!args || args_size != sizeof(aclrtEmulatedKernelArgs))
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtLaunchKernel: argsData must be an aclrtEmulatedKernelArgs "
                                                     "(%zu bytes), got %zu bytes",
                            sizeof(aclrtEmulatedKernelArgs), args_size);
    aclrtEmulatedKernelArgs k;
    memcpy(&k, args, sizeof k);
    if (k.duration_us > INT64_MAX || k.tag > INT64_MAX || k.out_ptr > INT64_MAX || k.in_ptr > INT64_MAX ||
        k.in_len > INT64_MAX)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtLaunchKernel: an argument overflows int64");
    int rc = session_ready("aclrtLaunchKernel");
    if (rc)
        return rc;
    int64_t sid;
    rc = stream_resolve(stream, &sid, "aclrtLaunchKernel");
    if (rc)
        return rc;
    int64_t a[6] = {sid, (int64_t)k.duration_us, (int64_t)k.tag, (int64_t)k.out_ptr, (int64_t)k.in_ptr,
                    (int64_t)k.in_len};
    return rpc_call(OP_LAUNCH_KERNEL, a, 6, NULL, 0, session.call_timeout_ms, "aclrtLaunchKernel");
}

API aclError aclrtLaunchKernel(aclrtFuncHandle funcHandle, uint32_t blockDim, const void *argsData, size_t argsSize,
                               aclrtStream stream)
{
    (void)blockDim;
    LOCKED(do_launch(funcHandle, argsData, argsSize, stream));
}
