/*
 * exec_config.c: aclmdlExecuteV2/aclmdlExecuteAsyncV2 and the execution config handle, built
 * against CANN's prototypes (tests/c/test_models.py). Usage:
 *   exec_config config            the handle's calls and refusals (no aclserver, no aclInit)
 *   exec_config timeout <model>   ExecuteV2 on a stream under ACL_MDL_STREAM_SYNC_TIMEOUT, for a
 *                                 model that runs longer than the timeout, then without one
 */
#include "check.h"

#include <acl/acl.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int set(aclmdlExecConfigHandle *h, aclmdlExecConfigAttr attr, const void *value, size_t size)
{
    return aclmdlSetExecConfigOpt(h, attr, value, size);
}

static void config(void)
{
    aclmdlExecConfigHandle *h = aclmdlCreateExecConfigHandle();
    CHECK(h != NULL, "aclmdlCreateExecConfigHandle");
    int32_t timeout = 5, bad_timeout = -2, priority = 1;
    size_t size = 4096;
    void *ptr = &size;
    expect(set(h, ACL_MDL_STREAM_SYNC_TIMEOUT, &timeout, sizeof timeout), ACL_SUCCESS, "stream timeout");
    expect(set(h, ACL_MDL_EVENT_SYNC_TIMEOUT, &timeout, sizeof timeout), ACL_SUCCESS, "event timeout");
    expect(set(h, ACL_MDL_WORK_ADDR_PTR, &ptr, sizeof ptr), ACL_SUCCESS, "work address");
    expect(set(h, ACL_MDL_WORK_SIZET, &size, sizeof size), ACL_SUCCESS, "work size");
    expect(set(h, ACL_MDL_MPAIMID_SIZET, &size, sizeof size), ACL_SUCCESS, "reserved mpam id");
    expect(set(h, ACL_MDL_MEC_TIMETHR_SIZET, &size, sizeof size), ACL_SUCCESS, "reserved mec threshold");
    expect(set(h, ACL_MDL_EXEC_PRIORITY_INT32, &priority, sizeof priority), ACL_SUCCESS, "priority");
    expect(set(h, ACL_MDL_STREAM_SYNC_TIMEOUT, &ptr, sizeof ptr), ACL_ERROR_INVALID_PARAM, "timeout of pointer size");
    expect(set(h, ACL_MDL_STREAM_SYNC_TIMEOUT, &bad_timeout, sizeof bad_timeout), ACL_ERROR_INVALID_PARAM,
           "timeout below -1");
    expect(set(h, ACL_MDL_WORK_ADDR_PTR, &ptr, 0), ACL_ERROR_INVALID_PARAM, "work address of 0 bytes");
    expect(set(h, ACL_MDL_WORK_SIZET, NULL, sizeof size), ACL_ERROR_INVALID_PARAM, "NULL value");
    expect(set(NULL, ACL_MDL_WORK_SIZET, &size, sizeof size), ACL_ERROR_INVALID_PARAM, "NULL handle");
    expect(set(h, (aclmdlExecConfigAttr)42, &size, sizeof size), ACL_ERROR_INVALID_PARAM, "attribute 42");
    expect(set(h, ACL_MDL_NPU_PERF_MODE, &priority, sizeof priority), ACL_ERROR_API_NOT_SUPPORT, "npu perf mode");
    const char *m = aclGetRecentErrMsg();
    CHECK(m && strstr(m, "ACL_MDL_NPU_PERF_MODE"), "the refusal names the attribute: %s", m ? m : "(none)");
    int64_t not_a_handle[4] = {0};
    expect(aclmdlExecuteV2(1, NULL, NULL, NULL, (const aclmdlExecConfigHandle *)not_a_handle),
           ACL_ERROR_INVALID_PARAM, "ExecuteV2 with a foreign handle");
    expect(aclmdlExecuteAsyncV2(1, NULL, NULL, NULL, (const aclmdlExecConfigHandle *)not_a_handle),
           ACL_ERROR_INVALID_PARAM, "ExecuteAsyncV2 with a foreign handle");
    expect(aclmdlDestroyExecConfigHandle(h), ACL_SUCCESS, "aclmdlDestroyExecConfigHandle");
    expect(aclmdlDestroyExecConfigHandle(NULL), ACL_ERROR_INVALID_PARAM, "destroy NULL");
}

static aclmdlDataset *dataset(aclmdlDesc *desc, int outputs)
{
    aclmdlDataset *ds = aclmdlCreateDataset();
    size_t n = outputs ? aclmdlGetNumOutputs(desc) : aclmdlGetNumInputs(desc);
    for (size_t i = 0; i < n; i++) {
        size_t size = outputs ? aclmdlGetOutputSizeByIndex(desc, i) : aclmdlGetInputSizeByIndex(desc, i);
        void *dev = NULL;
        CALL(aclrtMalloc(&dev, size, ACL_MEM_MALLOC_HUGE_FIRST));
        CALL(aclmdlAddDatasetBuffer(ds, aclCreateDataBuffer(dev, size)));
    }
    return ds;
}

static void timeout(const char *path)
{
    uint32_t id = 0;
    aclrtStream stream = NULL;
    CALL(aclInit(NULL));
    CALL(aclrtSetDevice(0));
    CALL(aclrtCreateStream(&stream));
    CALL(aclmdlLoadFromFile(path, &id));
    aclmdlDesc *desc = aclmdlCreateDesc();
    CALL(aclmdlGetDesc(desc, id));
    aclmdlDataset *in = dataset(desc, 0), *out = dataset(desc, 1);
    aclmdlExecConfigHandle *h = aclmdlCreateExecConfigHandle();
    int32_t ms = 1, forever = -1;
    CALL(aclmdlSetExecConfigOpt(h, ACL_MDL_STREAM_SYNC_TIMEOUT, &ms, sizeof ms));
    expect(aclmdlExecuteV2(id, in, out, stream, h), ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, "ExecuteV2 past its timeout");
    const char *m = aclGetRecentErrMsg();
    CHECK(m && strstr(m, "ACL_MDL_STREAM_SYNC_TIMEOUT"), "the timeout names the attribute: %s", m ? m : "(none)");
    aclrtStreamStatus status = ACL_STREAM_STATUS_COMPLETE;
    CALL(aclrtStreamQuery(stream, &status));
    CHECK(status == ACL_STREAM_STATUS_NOT_READY, "the timed-out execution still runs on the stream");
    CALL(aclrtSynchronizeStream(stream));
    CALL(aclmdlSetExecConfigOpt(h, ACL_MDL_STREAM_SYNC_TIMEOUT, &forever, sizeof forever));
    CALL(aclmdlExecuteV2(id, in, out, stream, h));
    CALL(aclrtStreamQuery(stream, &status));
    CHECK(status == ACL_STREAM_STATUS_COMPLETE, "ExecuteV2 on a stream returns when the stream's work is done");
    CALL(aclmdlExecuteV2(id, in, out, NULL, NULL));
    CALL(aclmdlDestroyExecConfigHandle(h));
    CALL(aclmdlUnload(id));
    CALL(aclrtDestroyStream(stream));
    CALL(aclFinalize());
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "config"))
        config();
    else if (argc == 3 && !strcmp(argv[1], "timeout"))
        timeout(argv[2]);
    else {
        fprintf(stderr, "usage: %s config | timeout <model>\n", argv[0]);
        return 2;
    }
    return finish();
}
