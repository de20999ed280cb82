/*
 * context.c: contexts, held in the client. A context binds the calling thread to a device; its
 * handle is checked against the session's table before every use.
 */
#include "client.h"

#include "acl/acl.h"

#include <stdlib.h>

static int do_create_context(aclrtContext *context, int32_t device)
{
    if (!context)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateContext: context is NULL");
    int rc = session_ready("aclrtCreateContext");
    if (rc)
        return rc;
    if (device < 0 || device >= session.device_count)
        return flexnpu_fail(ACL_ERROR_INVALID_DEVICE,
                            "aclrtCreateContext: device %d does not exist (this claim has 0..%d)", device,
                            session.device_count - 1);
    struct context *c = malloc(sizeof *c);
    if (!c || objects_add(c)) {
        free(c);
        return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "aclrtCreateContext: out of host memory");
    }
    *c = (struct context){CTX_MAGIC, device, session.generation};
    t_context = c;
    t_device = device;
    t_generation = session.generation;
    session.process_device = session.process_device == NO_DEVICE ? device : session.process_device;
    *context = c;
    return 0;
}

API aclError aclrtCreateContext(aclrtContext *context, int32_t deviceId)
{
    LOCKED(do_create_context(context, deviceId));
}

static int do_destroy_context(aclrtContext context)
{
    int rc = session_ready("aclrtDestroyContext");
    if (rc)
        return rc;
    if (!objects_has(context, CTX_MAGIC))
        return flexnpu_fail(ACL_ERROR_INVALID_RESOURCE_HANDLE, "aclrtDestroyContext: %p is not a context", context);
    for (int d = 0; d < session.device_count; d++)
        if (session.default_contexts[d] == context)
            return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtDestroyContext: %p is device %d's default context "
                                "(aclrtSetDevice made it; aclrtResetDevice releases it)", context, d);
    if (t_context == context)
        t_context = NULL;
    objects_remove(context);
    return 0;
}

API aclError aclrtDestroyContext(aclrtContext context)
{
    LOCKED(do_destroy_context(context));
}

static int do_set_current_context(aclrtContext context)
{
    int rc = session_ready("aclrtSetCurrentContext");
    if (rc)
        return rc;
    if (!objects_has(context, CTX_MAGIC))
        return flexnpu_fail(ACL_ERROR_INVALID_RESOURCE_HANDLE, "aclrtSetCurrentContext: %p is not a context",
                            context);
    struct context *c = context;
    t_context = c;
    t_device = c->device;
    t_generation = session.generation;
    return 0;
}

API aclError aclrtSetCurrentContext(aclrtContext context)
{
    LOCKED(do_set_current_context(context));
}

static int do_get_current_context(aclrtContext *context)
{
    if (!context)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtGetCurrentContext: context is NULL");
    int rc = session_ready("aclrtGetCurrentContext");
    if (rc)
        return rc;
    if (!t_context || !objects_has(t_context, CTX_MAGIC))
        return flexnpu_fail(ACL_ERROR_INVALID_RESOURCE_HANDLE,
                            "aclrtGetCurrentContext: this thread has no current context (aclrtCreateContext)");
    *context = t_context;
    return 0;
}

API aclError aclrtGetCurrentContext(aclrtContext *context)
{
    LOCKED(do_get_current_context(context));
}
