/*
 * stream.c: streams, served by the aclserver (a stream is the server's id). A NULL stream is the
 * calling thread's device's default stream, created on the server at its first use.
 */
#include "client.h"

#include "acl/acl.h"

static int do_create_stream(aclrtStream *stream, const char *what)
{
    if (!stream)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: stream is NULL", what);
    int rc = session_ready(what);
    if (!rc)
        rc = session_use_device(what, NULL);
    if (rc)
        return rc;
    int64_t id;
    rc = rpc_call(OP_CREATE_STREAM, NULL, 0, &id, 1, session.call_timeout_ms, what);
    if (!rc)
        *stream = (aclrtStream)(uintptr_t)id;
    return rc;
}

API aclError aclrtCreateStream(aclrtStream *stream)
{
    LOCKED(do_create_stream(stream, "aclrtCreateStream"));
}

/* Priority and flags select hardware queues a share does not have: every stream is the same. */
API aclError aclrtCreateStreamWithConfig(aclrtStream *stream, uint32_t priority, uint32_t flag)
{
    (void)priority;
    (void)flag;
    LOCKED(do_create_stream(stream, "aclrtCreateStreamWithConfig"));
}

int stream_resolve(aclrtStream stream, int64_t *id, const char *what)
{
    if (stream) {
        *id = (int64_t)(uintptr_t)stream;
        return 0;
    }
    int device;
    int rc = session_use_device(what, &device);
    if (rc)
        return rc;
    if (!session.default_streams[device]) {
        int64_t sid;
        rc = rpc_call(OP_CREATE_STREAM, NULL, 0, &sid, 1, session.call_timeout_ms, what);
        if (rc)
            return rc;
        session.default_streams[device] = (uint64_t)sid;
    }
    *id = (int64_t)session.default_streams[device];
    return 0;
}

static int do_destroy_stream(aclrtStream stream, const char *what)
{
    int rc = session_ready(what);
    if (rc)
        return rc;
    if (!stream)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: the default stream cannot be destroyed", what);
    int64_t id = (int64_t)(uintptr_t)stream;
    return rpc_call(OP_DESTROY_STREAM, &id, 1, NULL, 0, WAIT_FOREVER, what);
}

API aclError aclrtDestroyStream(aclrtStream stream)
{
    LOCKED(do_destroy_stream(stream, "aclrtDestroyStream"));
}

/* The aclserver cannot abandon a kernel it started: the forced form waits for the stream's
 * queued work as aclrtDestroyStream does, then destroys it. */
API aclError aclrtDestroyStreamForce(aclrtStream stream)
{
    LOCKED(do_destroy_stream(stream, "aclrtDestroyStreamForce"));
}

int stream_sync(aclrtStream stream, const char *what)
{
    int64_t id;
    int rc = stream_resolve(stream, &id, what);
    if (rc)
        return rc;
    return rpc_call(OP_SYNCHRONIZE_STREAM, &id, 1, NULL, 0, WAIT_FOREVER, what);
}

static int do_synchronize_stream(aclrtStream stream)
{
    int rc = session_ready("aclrtSynchronizeStream");
    return rc ? rc : stream_sync(stream, "aclrtSynchronizeStream");
}

API aclError aclrtSynchronizeStream(aclrtStream stream)
{
    LOCKED(do_synchronize_stream(stream));
}
