/*
 * vmm.c: CANN's virtual memory calls (torch's expandable segments: PYTORCH_NPU_ALLOC_CONF=
 * expandable_segments:True), served by the aclserver. A reserved range is device addresses the
 * share's memory can be mapped at; it is not charged. aclrtMallocPhysical charges the quota (a
 * handle to that many bytes); aclrtMapMem makes a handle's bytes reachable at an address inside a
 * reserved range, so tensors and copies address them there; unmapping releases them.
 * aclrtMemGetAllocationGranularity answers 2 MiB (CANN's huge page) for both options.
 */
#include "client.h"

#include "acl/acl.h"

#define GRANULARITY (2u << 20)

static int reserve(void **virPtr, size_t size, size_t alignment, void *expectPtr, uint64_t flags)
{
    const char *what = "aclrtReserveMemAddress";
    if (!virPtr || !size)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: virPtr %p, size %zu (both needed)", what, (void *)virPtr,
                            size);
    if (alignment && (alignment & (alignment - 1)))
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: alignment %zu is not a power of two", what, alignment);
    (void)expectPtr, (void)flags; /* a hint CANN may ignore: the share chooses the range */
    /* torch_npu probes support with a 512-byte reservation before any device is set: as CANN, that
     * works (the session opens as for aclrtSetDevice; the range is the thread's device's, else 0's) */
    int rc = session_open_implicitly(what);
    if (!rc)
        rc = session_ready(what);
    if (rc)
        return rc;
    int device = session_thread_device();
    device = device == NO_DEVICE ? 0 : device;
    int64_t args[2] = {device, (int64_t)size}, va;
    rc = rpc_call(OP_VMM_RESERVE, args, 2, &va, 1, session.call_timeout_ms, what);
    if (rc)
        return rc;
    if (add_alloc((uint64_t)va, size, device, 0)) {
        int64_t back = va;
        rpc_call(OP_VMM_RELEASE, &back, 1, NULL, 0, session.call_timeout_ms, what);
        return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "%s: out of host memory", what);
    }
    *virPtr = (void *)(uintptr_t)va;
    return 0;
}

API aclError aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment, void *expectPtr, uint64_t flags)
{
    LOCKED(reserve(virPtr, size, alignment, expectPtr, flags));
}

static int one_value(uint16_t op, const void *p, const char *what)
{
    if (!p)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: the address or handle is NULL", what);
    int rc = session_ready(what);
    if (rc)
        return rc;
    int64_t arg = (int64_t)(uintptr_t)p;
    return rpc_call(op, &arg, 1, NULL, 0, session.call_timeout_ms, what);
}

static int release(void *virPtr)
{
    int rc = one_value(OP_VMM_RELEASE, virPtr, "aclrtReleaseMemAddress");
    if (!rc)
        remove_alloc((uint64_t)(uintptr_t)virPtr);
    return rc;
}

API aclError aclrtReleaseMemAddress(void *virPtr)
{
    LOCKED(release(virPtr));
}

static int malloc_physical(aclrtDrvMemHandle *handle, size_t size, const aclrtPhysicalMemProp *prop, uint64_t flags)
{
    const char *what = "aclrtMallocPhysical";
    (void)flags;
    if (!handle || !size || !prop)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: handle %p, size %zu, prop %p (all needed)", what,
                            (void *)handle, size, (const void *)prop);
    int rc = session_ready(what);
    if (rc)
        return rc;
    int device = (int)prop->location.id; /* ACL_MEM_LOCATION_TYPE_DEVICE: the device's id */
    if (device < 0 || device >= session.device_count)
        return flexnpu_fail(ACL_ERROR_INVALID_DEVICE, "%s: prop->location.id %d is not a device of this claim "
                                                      "(0..%d)", what, device, session.device_count - 1);
    int64_t args[2] = {device, (int64_t)size}, h;
    rc = rpc_call(OP_VMM_MALLOC_PHYSICAL, args, 2, &h, 1, session.call_timeout_ms, what);
    if (!rc)
        *handle = (aclrtDrvMemHandle)(uintptr_t)h;
    return rc;
}

API aclError aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size, const aclrtPhysicalMemProp *prop,
                                 uint64_t flags)
{
    LOCKED(malloc_physical(handle, size, prop, flags));
}

API aclError aclrtFreePhysical(aclrtDrvMemHandle handle)
{
    LOCKED(one_value(OP_VMM_FREE_PHYSICAL, handle, "aclrtFreePhysical"));
}

static int map_mem(void *virPtr, size_t size, size_t offset, aclrtDrvMemHandle handle, uint64_t flags)
{
    const char *what = "aclrtMapMem";
    (void)flags;
    if (!virPtr || !handle || !size)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: virPtr %p, size %zu, handle %p (all needed)", what, virPtr,
                            size, (void *)handle);
    int rc = session_ready(what);
    if (rc)
        return rc;
    int64_t args[4] = {(int64_t)(uintptr_t)virPtr, (int64_t)size, (int64_t)offset, (int64_t)(uintptr_t)handle};
    return rpc_call(OP_VMM_MAP, args, 4, NULL, 0, session.call_timeout_ms, what);
}

API aclError aclrtMapMem(void *virPtr, size_t size, size_t offset, aclrtDrvMemHandle handle, uint64_t flags)
{
    LOCKED(map_mem(virPtr, size, offset, handle, flags));
}

API aclError aclrtUnmapMem(void *virPtr)
{
    LOCKED(one_value(OP_VMM_UNMAP, virPtr, "aclrtUnmapMem"));
}

API aclError aclrtMemGetAllocationGranularity(aclrtPhysicalMemProp *prop, aclrtMemGranularityOptions option,
                                              size_t *granularity)
{
    (void)option;
    if (!prop || !granularity)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtMemGetAllocationGranularity: prop %p, granularity %p",
                            (void *)prop, (void *)granularity);
    *granularity = GRANULARITY;
    return ACL_SUCCESS;
}
