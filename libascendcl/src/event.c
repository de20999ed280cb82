/*
 * event.c: events, held in the client. Recording an event waits for its stream's queued work on
 * the aclserver and stamps the time, so a recorded event is complete; elapsed time is the
 * difference of two stamps.
 */
#include "client.h"

#include "acl/acl.h"

#include <stdlib.h>
#include <time.h>

static int do_create_event(aclrtEvent *event, const char *what)
{
    if (!event)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: event is NULL", what);
    int rc = session_ready(what);
    if (rc)
        return rc;
    struct event *e = calloc(1, sizeof *e);
    if (!e || objects_add(e)) {
        free(e);
        return flexnpu_fail(ACL_ERROR_RT_NO_EVENT_RESOURCE, "%s: out of host memory", what);
    }
    e->magic = EVENT_MAGIC;
    *event = e;
    return 0;
}

API aclError aclrtCreateEvent(aclrtEvent *event)
{
    LOCKED(do_create_event(event, "aclrtCreateEvent"));
}

static int do_destroy_event(aclrtEvent event)
{
    int rc = session_ready("aclrtDestroyEvent");
    if (rc)
        return rc;
    if (!objects_has(event, EVENT_MAGIC))
        return flexnpu_fail(ACL_ERROR_INVALID_RESOURCE_HANDLE, "aclrtDestroyEvent: %p is not an event", event);
    objects_remove(event);
    return 0;
}

API aclError aclrtDestroyEvent(aclrtEvent event)
{
    LOCKED(do_destroy_event(event));
}

static int do_record_event(aclrtEvent event, aclrtStream stream)
{
    int rc = session_ready("aclrtRecordEvent");
    if (rc)
        return rc;
    if (!objects_has(event, EVENT_MAGIC))
        return flexnpu_fail(ACL_ERROR_INVALID_RESOURCE_HANDLE, "aclrtRecordEvent: %p is not an event", event);
    rc = stream_sync(stream, "aclrtRecordEvent");
    if (rc)
        return rc;
    struct event *e = event;
    clock_gettime(CLOCK_MONOTONIC, &e->at);
    e->recorded = 1;
    return 0;
}

API aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream)
{
    LOCKED(do_record_event(event, stream));
}

static int do_synchronize_event(aclrtEvent event)
{
    int rc = session_ready("aclrtSynchronizeEvent");
    if (rc)
        return rc;
    if (!objects_has(event, EVENT_MAGIC))
        return flexnpu_fail(ACL_ERROR_INVALID_RESOURCE_HANDLE, "aclrtSynchronizeEvent: %p is not an event", event);
    return 0; /* recording waited for the stream: a recorded event is complete */
}

API aclError aclrtSynchronizeEvent(aclrtEvent event)
{
    LOCKED(do_synchronize_event(event));
}

static int do_elapsed(float *ms, aclrtEvent start, aclrtEvent end)
{
    if (!ms)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtEventElapsedTime: ms is NULL");
    int rc = session_ready("aclrtEventElapsedTime");
    if (rc)
        return rc;
    if (!objects_has(start, EVENT_MAGIC) || !objects_has(end, EVENT_MAGIC))
        return flexnpu_fail(ACL_ERROR_INVALID_RESOURCE_HANDLE, "aclrtEventElapsedTime: an argument is not an event");
    struct event *a = start, *b = end;
    if (!a->recorded || !b->recorded)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtEventElapsedTime: both events must be recorded first");
    *ms = (float)((double)(b->at.tv_sec - a->at.tv_sec) * 1e3 + (double)(b->at.tv_nsec - a->at.tv_nsec) / 1e6);
    return 0;
}

API aclError aclrtEventElapsedTime(float *ms, aclrtEvent startEvent, aclrtEvent endEvent)
{
    LOCKED(do_elapsed(ms, startEvent, endEvent));
}

static int do_event_query(aclrtEvent event, int *recorded, const char *what)
{
    int rc = session_ready(what);
    if (rc)
        return rc;
    if (!objects_has(event, EVENT_MAGIC))
        return flexnpu_fail(ACL_ERROR_INVALID_RESOURCE_HANDLE, "%s: %p is not an event", what, event);
    if (recorded)
        *recorded = ((struct event *)event)->recorded;
    return 0;
}

API aclError aclrtCreateEventWithFlag(aclrtEvent *event, uint32_t flag)
{
    (void)flag; /* every event records a timestamp and synchronizes */
    LOCKED(do_create_event(event, "aclrtCreateEventWithFlag"));
}

API aclError aclrtCreateEventExWithFlag(aclrtEvent *event, uint32_t flag)
{
    (void)flag;
    LOCKED(do_create_event(event, "aclrtCreateEventExWithFlag"));
}

static int do_query_event(aclrtEvent event, aclrtEventStatus *status)
{
    if (!status)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtQueryEvent: status is NULL");
    int rc = do_event_query(event, NULL, "aclrtQueryEvent");
    if (!rc)
        *status = ACL_EVENT_STATUS_COMPLETE; /* recording waited for the stream */
    return rc;
}

API aclError aclrtQueryEvent(aclrtEvent event, aclrtEventStatus *status)
{
    LOCKED(do_query_event(event, status));
}

static int do_query_event_status(aclrtEvent event, aclrtEventRecordedStatus *status)
{
    if (!status)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtQueryEventStatus: status is NULL");
    int recorded = 0;
    int rc = do_event_query(event, &recorded, "aclrtQueryEventStatus");
    if (!rc)
        *status = recorded ? ACL_EVENT_RECORDED_STATUS_COMPLETE : ACL_EVENT_RECORDED_STATUS_NOT_READY;
    return rc;
}

API aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus *status)
{
    LOCKED(do_query_event_status(event, status));
}

static int do_reset_event(aclrtEvent event)
{
    int rc = do_event_query(event, NULL, "aclrtResetEvent");
    if (!rc)
        ((struct event *)event)->recorded = 0;
    return rc;
}

API aclError aclrtResetEvent(aclrtEvent event, aclrtStream stream)
{
    (void)stream;
    LOCKED(do_reset_event(event));
}

API aclError aclrtSynchronizeEventWithTimeout(aclrtEvent event, int32_t timeout)
{
    (void)timeout; /* a recorded event is complete */
    LOCKED(do_event_query(event, NULL, "aclrtSynchronizeEventWithTimeout"));
}

static int do_query_wait_status(aclrtEvent event, aclrtEventWaitStatus *status)
{
    if (!status)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtQueryEventWaitStatus: status is NULL");
    int recorded = 0;
    int rc = do_event_query(event, &recorded, "aclrtQueryEventWaitStatus");
    if (!rc)
        *status = recorded ? ACL_EVENT_WAIT_STATUS_COMPLETE : ACL_EVENT_WAIT_STATUS_NOT_READY;
    return rc;
}

/* A wait for a recorded event is over at once (recording waited for its stream). */
API aclError aclrtQueryEventWaitStatus(aclrtEvent event, aclrtEventWaitStatus *status)
{
    LOCKED(do_query_wait_status(event, status));
}

API aclError aclrtStreamWaitEventWithTimeout(aclrtStream stream, aclrtEvent event, int32_t timeout)
{
    (void)stream;
    (void)timeout; /* recorded events are already complete */
    LOCKED(do_event_query(event, NULL, "aclrtStreamWaitEventWithTimeout"));
}

API aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event)
{
    (void)stream;
    LOCKED(do_event_query(event, NULL, "aclrtStreamWaitEvent"));
}
