/*
 * mdl_exec.c: aclmdlExecuteV2/aclmdlExecuteAsyncV2 and their execution config handle
 * (aclmdlCreateExecConfigHandle, aclmdlSetExecConfigOpt, aclmdlDestroyExecConfigHandle).
 *
 * The handle lives here (no server round trip). Each attribute of CANN's aclmdlExecConfigAttr is
 * checked for its type's size and kept; ACL_MDL_NPU_PERF_MODE answers 200001. Served by the
 * same path as aclmdlExecute/ExecuteAsync (mdl.c): aclmdlExecuteV2 with a NULL stream is
 * aclmdlExecute (CANN: the attributes then take no effect); with a stream it queues the
 * execution there and waits for the stream, at most ACL_MDL_STREAM_SYNC_TIMEOUT ms when that is
 * set (507046 when it is exceeded; the execution still runs). aclmdlExecuteAsyncV2 is
 * aclmdlExecuteAsync. The work-memory attributes are kept but unused: the aclserver gave the
 * model its work memory at load; the event timeout, priority and reserved attributes likewise.
 */
#include "client.h"

#include "acl/acl.h"

#include <stdlib.h>
#include <string.h>

#define EXEC_CONFIG_MAGIC 0x464E4D58u /* "FNMX" */

struct aclmdlExecConfigHandle {
    uint32_t magic;
    int32_t stream_timeout, event_timeout, priority; /* ms (-1: without limit), ms, priority */
    void *work;
    size_t work_size;
    size_t reserved[4]; /* MPAIMID, AICQOS, AICOST, MEC_TIMETHR */
};

API aclmdlExecConfigHandle *aclmdlCreateExecConfigHandle(void)
{
    aclmdlExecConfigHandle *h = calloc(1, sizeof *h);
    if (!h) {
        flexnpu_fail(ACL_ERROR_BAD_ALLOC, "aclmdlCreateExecConfigHandle: out of host memory");
        return NULL;
    }
    h->magic = EXEC_CONFIG_MAGIC;
    h->stream_timeout = h->event_timeout = -1; /* CANN's default: wait without limit */
    return h;
}

API aclError aclmdlDestroyExecConfigHandle(const aclmdlExecConfigHandle *handle)
{
    if (!handle || handle->magic != EXEC_CONFIG_MAGIC)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclmdlDestroyExecConfigHandle: %s",
                            handle ? "not a live aclmdlExecConfigHandle" : "handle is NULL");
    aclmdlExecConfigHandle *h = (aclmdlExecConfigHandle *)handle;
    h->magic = 0;
    free(h);
    return ACL_SUCCESS;
}

/* valueSize must be the size of the attribute's type; the pointer attribute points to the pointer. */
API aclError aclmdlSetExecConfigOpt(aclmdlExecConfigHandle *handle, aclmdlExecConfigAttr attr, const void *attrValue,
                                    size_t valueSize)
{
    const char *what = "aclmdlSetExecConfigOpt";
    if (!handle || handle->magic != EXEC_CONFIG_MAGIC || !attrValue)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s", what,
                            !attrValue ? "attrValue is NULL" : "handle is not a live aclmdlExecConfigHandle");
    if (attr == ACL_MDL_NPU_PERF_MODE)
        return flexnpu_fail(ACL_ERROR_API_NOT_SUPPORT,
                            "%s: ACL_MDL_NPU_PERF_MODE is not supported on a FlexNPU share", what);
    if ((int)attr < 0 || attr > ACL_MDL_EXEC_PRIORITY_INT32)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %d is not an aclmdlExecConfigAttr", what, (int)attr);
    int is_int32 = attr == ACL_MDL_STREAM_SYNC_TIMEOUT || attr == ACL_MDL_EVENT_SYNC_TIMEOUT ||
                   attr == ACL_MDL_EXEC_PRIORITY_INT32;
    size_t want = is_int32 ? sizeof(int32_t) : attr == ACL_MDL_WORK_ADDR_PTR ? sizeof(void *) : sizeof(size_t);
    if (valueSize != want)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: attribute %d takes %zu bytes, valueSize is %zu", what,
                            (int)attr, want, valueSize);
    int32_t i32 = 0;
    if (is_int32)
        memcpy(&i32, attrValue, sizeof i32);
    if ((attr == ACL_MDL_STREAM_SYNC_TIMEOUT || attr == ACL_MDL_EVENT_SYNC_TIMEOUT) && i32 < -1)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: timeout %d is neither -1 nor a number of ms", what,
                            (int)i32);
    switch (attr) {
    case ACL_MDL_STREAM_SYNC_TIMEOUT:
        handle->stream_timeout = i32;
        break;
    case ACL_MDL_EVENT_SYNC_TIMEOUT:
        handle->event_timeout = i32;
        break;
    case ACL_MDL_EXEC_PRIORITY_INT32:
        handle->priority = i32;
        break;
    case ACL_MDL_WORK_ADDR_PTR:
        memcpy(&handle->work, attrValue, sizeof handle->work);
        break;
    case ACL_MDL_WORK_SIZET:
        memcpy(&handle->work_size, attrValue, sizeof handle->work_size);
        break;
    default: /* the reserved size_t attributes */
        memcpy(&handle->reserved[attr - ACL_MDL_MPAIMID_SIZET], attrValue, sizeof(size_t));
        break;
    }
    return ACL_SUCCESS;
}

/* NULL (no attributes) or a live handle. */
static int exec_config_check(const aclmdlExecConfigHandle *handle, const char *what)
{
    if (handle && handle->magic != EXEC_CONFIG_MAGIC)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: handle is not a live aclmdlExecConfigHandle", what);
    return 0;
}

static int do_execute_v2(uint32_t model_id, const aclmdlDataset *in, aclmdlDataset *out, aclrtStream stream,
                         const aclmdlExecConfigHandle *handle)
{
    const char *what = "aclmdlExecuteV2";
    int rc = exec_config_check(handle, what);
    if (rc)
        return rc;
    if (!stream)
        return mdl_execute(model_id, in, out, NULL, 0, what);
    rc = mdl_execute(model_id, in, out, stream, 1, what);
    if (rc)
        return rc;
    int32_t timeout = handle ? handle->stream_timeout : -1;
    int finished = 0;
    rc = stream_sync_within(stream, timeout, &finished, what);
    if (!rc && !finished)
        rc = flexnpu_fail(ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
                          "%s: the execution did not finish within ACL_MDL_STREAM_SYNC_TIMEOUT (%d ms)", what,
                          (int)timeout);
    return rc;
}

API aclError aclmdlExecuteV2(uint32_t modelId, const aclmdlDataset *input, aclmdlDataset *output, aclrtStream stream,
                             const aclmdlExecConfigHandle *handle)
{
    LOCKED(do_execute_v2(modelId, input, output, stream, handle));
}

static int do_execute_async_v2(uint32_t model_id, const aclmdlDataset *in, aclmdlDataset *out, aclrtStream stream,
                               const aclmdlExecConfigHandle *handle)
{
    int rc = exec_config_check(handle, "aclmdlExecuteAsyncV2");
    return rc ? rc : mdl_execute(model_id, in, out, stream, 1, "aclmdlExecuteAsyncV2");
}

API aclError aclmdlExecuteAsyncV2(uint32_t modelId, const aclmdlDataset *input, aclmdlDataset *output,
                                  aclrtStream stream, const aclmdlExecConfigHandle *handle)
{
    LOCKED(do_execute_async_v2(modelId, input, output, stream, handle));
}
