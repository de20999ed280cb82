/*
 * kernel.c: kernel launch. A launch with funcHandle NULL is the emulated backend's kernel
 * (acl/flexnpu_kernel.h): its arguments go to the aclserver, which runs it in stream order under
 * the share's compute policy. A kernel binary (aclrtBinaryLoadFromData) is shipped to the aclserver once
 * per load, through the staging region (a byte blob, as a model's); its functions are looked up there
 * (aclrtBinaryGetFunction) and launched with their arguments by value (LAUNCH_FUNCTION, queued on the
 * stream). The ascend backend forwards them to the host's CANN; the emulated one answers 200001.
 */
#include "client.h"

#include "acl/acl.h"
#include "acl/flexnpu_kernel.h"

#include <stdlib.h>
#include <string.h>

#define BIN_MAGIC 0x464E5042u  /* "FNPB" */
#define FUNC_MAGIC 0x464E5046u /* "FNPF" */
#define MAX_KERNEL_ARGS (64u * 1024u)
#define MAX_KERNEL_NAME 256u

struct binary {
    uint32_t magic;
    int64_t id; /* the aclserver's */
};

struct function {
    uint32_t magic;
    int64_t id;
    const struct binary *bin;
};

static int launch_function(const struct function *f, uint32_t blocks, const void *args, size_t args_size,
                           aclrtStream stream, const char *what)
{
    if (args_size > MAX_KERNEL_ARGS || (args_size && !args))
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %zu bytes of arguments at %p (at most %u)", what, args_size,
                            args, MAX_KERNEL_ARGS);
    if (!blocks)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: numBlocks is 0", what);
    int rc = session_ready(what);
    if (rc)
        return rc;
    int64_t sid;
    rc = stream_resolve(stream, &sid, what);
    if (rc)
        return rc;
    int64_t a[3] = {sid, f->id, (int64_t)blocks};
    uint32_t rid;
    rc = rpc_send(OP_LAUNCH_FUNCTION, a, 3, args, args_size, &rid, what);
    return rc ? rc : rpc_receive(rid, NULL, 0, session.call_timeout_ms, what, NULL);
}

static int do_launch(aclrtFuncHandle func, uint32_t blocks, const void *args, size_t args_size, aclrtStream stream)
{
    if (func) {
        if (!objects_has(func, FUNC_MAGIC))
            return flexnpu_fail(ACL_ERROR_INVALID_PARAM,
                                "aclrtLaunchKernel: funcHandle is not one aclrtBinaryGetFunction gave (NULL: the "
                                "emulated kernel, with aclrtEmulatedKernelArgs)");
        return launch_function(func, blocks, args, args_size, stream, "aclrtLaunchKernel");
    }
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
    LOCKED(do_launch(funcHandle, blockDim, argsData, argsSize, stream));
}

API aclError aclrtLaunchKernelV2(aclrtFuncHandle funcHandle, uint32_t numBlocks, const void *argsData,
                                 size_t argsSize, aclrtLaunchKernelCfg *cfg, aclrtStream stream)
{
    if (cfg && cfg->numAttrs)
        return flexnpu_fail(ACL_ERROR_API_NOT_SUPPORT, "aclrtLaunchKernelV2: launch attributes are not served");
    LOCKED(do_launch(funcHandle, numBlocks, argsData, argsSize, stream));
}

API aclError aclrtLaunchKernelWithHostArgs(aclrtFuncHandle funcHandle, uint32_t numBlocks, aclrtStream stream,
                                           aclrtLaunchKernelCfg *cfg, void *hostArgs, size_t argsSize,
                                           aclrtPlaceHolderInfo *placeHolderArray, size_t placeHolderNum)
{
    (void)placeHolderArray;
    if ((cfg && cfg->numAttrs) || placeHolderNum)
        return flexnpu_fail(ACL_ERROR_API_NOT_SUPPORT,
                            "aclrtLaunchKernelWithHostArgs: launch attributes and placeholders are not served");
    if (!funcHandle)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtLaunchKernelWithHostArgs: funcHandle is NULL");
    LOCKED(do_launch(funcHandle, numBlocks, hostArgs, argsSize, stream));
}

static int do_binary_load(const char *path, const void *data, size_t length, aclrtBinHandle *out, const char *what)
{
    if ((!path && (!data || !length)) || !out)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s and binHandle are required", what,
                            path ? "binPath" : "data, length");
    int rc = session_ready(what);
    if (!rc)
        rc = session_use_device(what, NULL);
    int64_t blob, id;
    if (!rc)
        rc = model_send(path, data, length, &blob, what);
    if (rc)
        return rc;
    rc = rpc_call(OP_BINARY_LOAD, &blob, 1, &id, 1, session.call_timeout_ms, what);
    if (rc) {
        if (!session.dead)
            blob_close(blob, what); /* a refused load keeps the blob: drop it */
        return rc;
    }
    struct binary *b = calloc(1, sizeof *b);
    if (!b || objects_add(b)) {
        free(b);
        rpc_call(OP_BINARY_UNLOAD, &id, 1, NULL, 0, session.call_timeout_ms, what);
        return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "%s: out of host memory", what);
    }
    b->magic = BIN_MAGIC;
    b->id = id;
    *out = b;
    return 0;
}

API aclError aclrtBinaryLoadFromData(const void *data, size_t length, const aclrtBinaryLoadOptions *options,
                                     aclrtBinHandle *binHandle)
{
    (void)options; /* CANN's load options (lazy load, magic, CPU kernel mode) change nothing here */
    LOCKED(do_binary_load(NULL, data, length, binHandle, "aclrtBinaryLoadFromData"));
}

API aclError aclrtBinaryLoadFromFile(const char *binPath, aclrtBinaryLoadOptions *options, aclrtBinHandle *binHandle)
{
    (void)options;
    if (!binPath)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclrtBinaryLoadFromFile: binPath is NULL");
    LOCKED(do_binary_load(binPath, NULL, 0, binHandle, "aclrtBinaryLoadFromFile"));
}

static int do_get_function(const aclrtBinHandle bin, const char *name, aclrtFuncHandle *out)
{
    const char *what = "aclrtBinaryGetFunction";
    if (!objects_has(bin, BIN_MAGIC))
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: binHandle is not one aclrtBinaryLoadFromData gave", what);
    size_t n = name ? strnlen(name, MAX_KERNEL_NAME + 1) : 0;
    if (!n || n > MAX_KERNEL_NAME || !out)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: a kernel name of 1..%u bytes and funcHandle are required",
                            what, MAX_KERNEL_NAME);
    int rc = session_ready(what);
    if (rc)
        return rc;
    const struct binary *b = bin;
    uint32_t rid;
    int64_t id = 0;
    rc = rpc_send(OP_BINARY_GET_FUNCTION, &b->id, 1, name, n, &rid, what);
    if (!rc)
        rc = rpc_receive(rid, &id, 1, session.call_timeout_ms, what, NULL);
    if (rc)
        return rc;
    struct function *f = calloc(1, sizeof *f);
    if (!f || objects_add(f)) {
        free(f);
        return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "%s: out of host memory", what);
    }
    f->magic = FUNC_MAGIC;
    f->id = id;
    f->bin = b;
    *out = f;
    return 0;
}

API aclError aclrtBinaryGetFunction(const aclrtBinHandle binHandle, const char *kernelName,
                                    aclrtFuncHandle *funcHandle)
{
    LOCKED(do_get_function(binHandle, kernelName, funcHandle));
}

static int do_unload(aclrtBinHandle bin)
{
    const char *what = "aclrtBinaryUnLoad";
    if (!objects_has(bin, BIN_MAGIC))
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: binHandle is not one aclrtBinaryLoadFromData gave", what);
    int rc = session_ready(what);
    if (rc)
        return rc;
    struct binary *b = bin;
    rc = rpc_call(OP_BINARY_UNLOAD, &b->id, 1, NULL, 0, WAIT_FOREVER, what);
    if (!rc)
        objects_remove(b); /* its function handles stay allocated: a later launch of one fails on the server */
    return rc;
}

API aclError aclrtBinaryUnLoad(aclrtBinHandle binHandle)
{
    LOCKED(do_unload(binHandle));
}
