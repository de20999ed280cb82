/*
 * device.c: the claim's devices (virtual ids 0..n-1): set, reset, get, count, run mode, SoC name,
 * synchronize. The current device is per thread; a thread that set none uses the device the
 * process set last.
 *
 * Before aclInit, as CANN: aclrtGetDeviceCount and aclrtGetSocName answer from client.conf (read,
 * not connected: the count is its shares, the name its soc_name), aclrtGetRunMode from what the
 * library is (ACL_HOST), and aclrtSetDevice opens the session itself.
 */
#include "client.h"

#include "acl/acl.h"

#include <stdio.h>
#include <stdlib.h>

static int do_set_device(int32_t device)
{
    int rc = session_open_implicitly("aclrtSetDevice");
    if (!rc)
        rc = session_ready("aclrtSetDevice");
    if (rc)
        return rc;
    if (device < 0 || device >= session.device_count)
        return flexnpu_fail(ACL_ERROR_INVALID_DEVICE,
                            "aclrtSetDevice: device %d does not exist (this claim has 0..%d)", device,
                            session.device_count - 1);
    int64_t arg = device;
    rc = rpc_call(OP_SET_DEVICE, &arg, 1, NULL, 0, session.call_timeout_ms, "aclrtSetDevice");
    if (rc)
        return rc;
    session.server_device = device;
    session.process_device = device;
    t_device = device;
    t_generation = session.generation;
    /* CANN: the device's default context becomes the thread's current context (torch_npu asks for
     * it right after aclrtSetDevice); one per device, released with the session */
    struct context *c = session.default_contexts[device];
    if (!c) {
        c = malloc(sizeof *c);
        if (!c || objects_add(c)) {
            free(c);
            return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "aclrtSetDevice: out of host memory");
        }
        *c = (struct context){CTX_MAGIC, device, session.generation};
        session.default_contexts[device] = c;
    }
    t_context = c;
    return 0;
}

API aclError aclrtSetDevice(int32_t deviceId)
{
    LOCKED(do_set_device(deviceId));
}

static int do_reset_device(int32_t device, const char *what)
{
    int rc = session_ready(what);
    if (rc)
        return rc;
    int64_t arg = device;
    rc = rpc_call(OP_RESET_DEVICE, &arg, 1, NULL, 0, session.call_timeout_ms, what);
    if (rc)
        return rc;
    session.server_device = NO_DEVICE;
    if (session.process_device == device)
        session.process_device = NO_DEVICE;
    if (t_device == device)
        t_device = NO_DEVICE;
    if (t_context && t_context == session.default_contexts[device])
        t_context = NULL;
    return 0;
}

API aclError aclrtResetDevice(int32_t deviceId)
{
    LOCKED(do_reset_device(deviceId, "aclrtResetDevice"));
}

/* A share's reset is already immediate and whole: the forced form is the same call. */
API aclError aclrtResetDeviceForce(int32_t deviceId)
{
    LOCKED(do_reset_device(deviceId, "aclrtResetDeviceForce"));
}

static int do_get_device(int32_t *device)
{
    if (!device)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDevice: deviceId is NULL");
    int rc = session_ready("aclrtGetDevice");
    if (rc)
        return rc;
    int d = session_thread_device();
    if (d == NO_DEVICE)
        return flexnpu_fail(ACL_ERROR_INVALID_DEVICE, "aclrtGetDevice: no device is set; call aclrtSetDevice first");
    *device = d;
    return 0;
}

API aclError aclrtGetDevice(int32_t *deviceId)
{
    LOCKED(do_get_device(deviceId));
}

static int do_get_device_count(uint32_t *count)
{
    if (!count)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceCount: count is NULL");
    if (!session.initialized) {
        struct client_conf conf;
        int rc = session_conf(&conf, "aclrtGetDeviceCount");
        if (!rc)
            *count = (uint32_t)conf.share_count;
        return rc;
    }
    int rc = session_ready("aclrtGetDeviceCount");
    if (rc)
        return rc;
    int64_t n;
    rc = rpc_call(OP_GET_DEVICE_COUNT, NULL, 0, &n, 1, session.call_timeout_ms, "aclrtGetDeviceCount");
    if (rc)
        return rc;
    *count = (uint32_t)n;
    return 0;
}

API aclError aclrtGetDeviceCount(uint32_t *count)
{
    LOCKED(do_get_device_count(count));
}

API aclError aclrtGetRunMode(aclrtRunMode *runMode)
{
    if (!runMode)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtGetRunMode: runMode is NULL");
    *runMode = ACL_HOST;
    return ACL_SUCCESS;
}

API const char *aclrtGetSocName(void)
{
    static char name[sizeof session.conf.soc_name];
    struct client_conf conf;
    pthread_mutex_lock(&session.lock);
    const char *out = NULL;
    if (session_conf(&conf, "aclrtGetSocName") == 0) {
        snprintf(name, sizeof name, "%s", conf.soc_name[0] ? conf.soc_name : "FlexNPU-vNPU");
        out = name;
    }
    pthread_mutex_unlock(&session.lock);
    return out;
}

static int do_synchronize_device(void)
{
    int rc = session_ready("aclrtSynchronizeDevice");
    if (!rc)
        rc = session_use_device("aclrtSynchronizeDevice", NULL);
    if (rc)
        return rc;
    return rpc_call(OP_SYNCHRONIZE_DEVICE, NULL, 0, NULL, 0, WAIT_FOREVER, "aclrtSynchronizeDevice");
}

API aclError aclrtSynchronizeDevice(void)
{
    LOCKED(do_synchronize_device());
}

/* As aclrtSynchronizeDevice, waiting at most timeout ms (-1: without limit; the round trip gets
 * WAIT_GRACE_MS more); an unanswered wait is left to the server and its late answer dropped. */
static int do_synchronize_device_with_timeout(int32_t timeout)
{
    const char *what = "aclrtSynchronizeDeviceWithTimeout";
    if (timeout < -1)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: timeout %d is neither -1 nor a number of ms", what,
                            (int)timeout);
    int rc = session_ready(what);
    if (!rc)
        rc = session_use_device(what, NULL);
    int finished = 1;
    if (!rc)
        rc = rpc_wait_within(OP_SYNCHRONIZE_DEVICE, NULL, 0, timeout < 0 ? WAIT_FOREVER : (int)timeout + WAIT_GRACE_MS,
                             &finished, what);
    if (!rc && !finished)
        rc = flexnpu_fail(ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, "%s: the device's work did not finish within %d ms", what,
                          (int)timeout);
    return rc;
}

API aclError aclrtSynchronizeDeviceWithTimeout(int32_t timeout)
{
    LOCKED(do_synchronize_device_with_timeout(timeout));
}

/* -- peer access: every device of a claim reaches the others' memory (one aclserver holds it all) -- */

/* 0 when device and peer are two distinct devices of the claim (count read as for the count call). */
static int peer_pair(int32_t device, int32_t peer, const char *what)
{
    uint32_t count = 0;
    int rc = do_get_device_count(&count);
    if (rc)
        return rc;
    if (device < 0 || (uint32_t)device >= count || peer < 0 || (uint32_t)peer >= count)
        return flexnpu_fail(ACL_ERROR_INVALID_DEVICE, "%s: devices %d and %d: this claim has 0..%u", what, device,
                            peer, count - 1);
    if (device == peer)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: deviceId %d cannot be equal to peerDeviceId %d", what,
                            device, peer);
    return 0;
}

static int do_can_access_peer(int32_t *can, int32_t device, int32_t peer)
{
    if (!can)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtDeviceCanAccessPeer: canAccessPeer is NULL");
    int rc = peer_pair(device, peer, "aclrtDeviceCanAccessPeer");
    if (!rc)
        *can = 1;
    return rc;
}

API aclError aclrtDeviceCanAccessPeer(int32_t *canAccessPeer, int32_t deviceId, int32_t peerDeviceId)
{
    LOCKED(do_can_access_peer(canAccessPeer, deviceId, peerDeviceId));
}

static int do_peer_access(int32_t peer, uint32_t flags, const char *what)
{
    if (flags)
        return flexnpu_fail(ACL_ERROR_FEATURE_UNSUPPORTED, "%s: flags must be 0, got %u", what, flags);
    int rc = session_ready(what);
    if (rc)
        return rc;
    int device = session_thread_device();
    if (device == NO_DEVICE)
        return flexnpu_fail(ACL_ERROR_INVALID_DEVICE, "%s: no device is set; call aclrtSetDevice first", what);
    return peer_pair(device, peer, what);
}

/* Access is always there on a share: enabling and disabling check the devices and change nothing. */
API aclError aclrtDeviceEnablePeerAccess(int32_t peerDeviceId, uint32_t flags)
{
    LOCKED(do_peer_access(peerDeviceId, flags, "aclrtDeviceEnablePeerAccess"));
}

API aclError aclrtDeviceDisablePeerAccess(int32_t peerDeviceId)
{
    LOCKED(do_peer_access(peerDeviceId, 0, "aclrtDeviceDisablePeerAccess"));
}
