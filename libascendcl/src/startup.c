/*
 * startup.c: the calls a framework makes at start-up and that CANN answers on an A2 die (torch_npu
 * treats a non-success answer of a function it found as fatal). Each is served in the client:
 *
 *   aclGetCannAttribute        INF_NAN 1 (the die computes Inf/NaN), BF16 1 (as A2: the operator set
 *                              computes bfloat16 in float32), JIT_COMPILE 0 (nothing is compiled)
 *   aclrt(Ctx)Get/SetSysParamOpt   kept per process / per thread (default 0); the
 *                              deterministic option is always honoured (the kernels are deterministic)
 *   aclrtSetOpExecuteTimeOut*  kept; the granted timeout is the one asked for (not enforced: an
 *                              operator's die time is bounded by the cost model)
 *   aclrtSetStreamFailureMode  0 (continue) or 1 (stop) accepted; streams continue after a failed
 *                              operator, whose error the next synchronize returns
 *   aclmdlRICaptureGetInfo     status NONE, no model: a share never captures
 *   aclrtGet/SetDeviceSatMode  kept (default INFNAN, as A2)
 */
#include "client.h"

#include "acl/acl.h"

#define SYS_OPTS 8

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t device_opts[SYS_OPTS];
static _Thread_local int64_t ctx_opts[SYS_OPTS];
static uint64_t op_timeout_us;
static int sat_mode = ACL_RT_OVERFLOW_MODE_INFNAN;

API aclError aclGetCannAttribute(aclCannAttr cannAttr, int32_t *value)
{
    if (!value)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclGetCannAttribute: value is NULL");
    switch (cannAttr) {
    case ACL_CANN_ATTR_INF_NAN:
    case ACL_CANN_ATTR_BF16:
        *value = 1;
        return ACL_SUCCESS;
    case ACL_CANN_ATTR_JIT_COMPILE:
        *value = 0;
        return ACL_SUCCESS;
    default:
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclGetCannAttribute: %d is not an aclCannAttr", (int)cannAttr);
    }
}

static int opt_index(aclSysParamOpt opt, const char *what)
{
    if ((int)opt < 0 || (int)opt >= SYS_OPTS)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %d is not an aclSysParamOpt", what, (int)opt);
    return 0;
}

API aclError aclrtGetSysParamOpt(aclSysParamOpt opt, int64_t *value)
{
    if (!value)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtGetSysParamOpt: value is NULL");
    int rc = opt_index(opt, "aclrtGetSysParamOpt");
    if (rc)
        return rc;
    pthread_mutex_lock(&lock);
    *value = device_opts[opt];
    pthread_mutex_unlock(&lock);
    return ACL_SUCCESS;
}

API aclError aclrtSetSysParamOpt(aclSysParamOpt opt, int64_t value)
{
    int rc = opt_index(opt, "aclrtSetSysParamOpt");
    if (rc)
        return rc;
    pthread_mutex_lock(&lock);
    device_opts[opt] = value;
    pthread_mutex_unlock(&lock);
    return ACL_SUCCESS;
}

API aclError aclrtCtxGetSysParamOpt(aclSysParamOpt opt, int64_t *value)
{
    if (!value)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtCtxGetSysParamOpt: value is NULL");
    int rc = opt_index(opt, "aclrtCtxGetSysParamOpt");
    if (!rc)
        *value = ctx_opts[opt];
    return rc;
}

API aclError aclrtCtxSetSysParamOpt(aclSysParamOpt opt, int64_t value)
{
    int rc = opt_index(opt, "aclrtCtxSetSysParamOpt");
    if (!rc)
        ctx_opts[opt] = value;
    return rc;
}

static aclError set_timeout(uint64_t us)
{
    pthread_mutex_lock(&lock);
    op_timeout_us = us;
    pthread_mutex_unlock(&lock);
    return ACL_SUCCESS;
}

API aclError aclrtSetOpExecuteTimeOut(uint32_t timeout)
{
    return set_timeout((uint64_t)timeout * 1000000u);
}

API aclError aclrtSetOpExecuteTimeOutWithMs(uint32_t timeout)
{
    return set_timeout((uint64_t)timeout * 1000u);
}

API aclError aclrtSetOpExecuteTimeOutV2(uint64_t timeout, uint64_t *actualTimeout)
{
    if (!actualTimeout)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtSetOpExecuteTimeOutV2: actualTimeout is NULL");
    *actualTimeout = timeout;
    return set_timeout(timeout);
}

API aclError aclrtSetStreamFailureMode(aclrtStream stream, uint64_t mode)
{
    (void)stream;
    if (mode > 1)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtSetStreamFailureMode: mode %llu is not 0 (continue) or "
                                                     "1 (stop)", (unsigned long long)mode);
    return ACL_SUCCESS;
}

API aclError aclmdlRICaptureGetInfo(aclrtStream stream, aclmdlRICaptureStatus *status, aclmdlRI *modelRI)
{
    (void)stream;
    if (!status)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclmdlRICaptureGetInfo: status is NULL");
    *status = ACL_MODEL_RI_CAPTURE_STATUS_NONE;
    if (modelRI)
        *modelRI = NULL;
    return ACL_SUCCESS;
}

API aclError aclrtSetDeviceSatMode(aclrtFloatOverflowMode mode)
{
    if (mode != ACL_RT_OVERFLOW_MODE_SATURATION && mode != ACL_RT_OVERFLOW_MODE_INFNAN)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtSetDeviceSatMode: mode %d", (int)mode);
    pthread_mutex_lock(&lock);
    sat_mode = (int)mode;
    pthread_mutex_unlock(&lock);
    return ACL_SUCCESS;
}

API aclError aclrtGetDeviceSatMode(aclrtFloatOverflowMode *mode)
{
    if (!mode)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceSatMode: mode is NULL");
    pthread_mutex_lock(&lock);
    *mode = (aclrtFloatOverflowMode)sat_mode;
    pthread_mutex_unlock(&lock);
    return ACL_SUCCESS;
}
