/*
 * stream.c: streams, served by the aclserver (a stream is the server's id). A NULL stream is the
 * calling thread's device's default stream, created on the server at its first use.
 *
 * A wait with a timeout (aclrtSynchronizeStreamWithTimeout, aclrtStreamQuery) gives the server
 * the timeout plus WAIT_GRACE_MS for the round trip; when it has not answered by then the call
 * reports the stream unfinished, and the server's late answer is dropped when it comes (the
 * server answers waits out of order, by request id).
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

int stream_sync_within(aclrtStream stream, int32_t timeout, int *finished, const char *what)
{
    if (timeout < -1)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: timeout %d is neither -1 nor a number of ms", what,
                            (int)timeout);
    int64_t id;
    int rc = session_ready(what);
    if (!rc)
        rc = stream_resolve(stream, &id, what);
    if (rc)
        return rc;
    int wait_ms = timeout < 0 ? WAIT_FOREVER : (int)timeout + WAIT_GRACE_MS;
    return rpc_wait_within(OP_SYNCHRONIZE_STREAM, &id, 1, wait_ms, finished, what);
}

static int do_synchronize_stream_with_timeout(aclrtStream stream, int32_t timeout)
{
    int finished;
    int rc = stream_sync_within(stream, timeout, &finished, "aclrtSynchronizeStreamWithTimeout");
    if (!rc && !finished)
        rc = flexnpu_fail(ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
                          "aclrtSynchronizeStreamWithTimeout: the stream's work did not finish within %d ms",
                          (int)timeout);
    return rc;
}

API aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout)
{
    LOCKED(do_synchronize_stream_with_timeout(stream, timeout));
}

static int do_stream_query(aclrtStream stream, aclrtStreamStatus *status)
{
    if (!status)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtStreamQuery: status is NULL");
    int finished;
    int rc = stream_sync_within(stream, 0, &finished, "aclrtStreamQuery");
    if (!rc)
        *status = finished ? ACL_STREAM_STATUS_COMPLETE : ACL_STREAM_STATUS_NOT_READY;
    return rc;
}

API aclError aclrtStreamQuery(aclrtStream stream, aclrtStreamStatus *status)
{
    LOCKED(do_stream_query(stream, status));
}
