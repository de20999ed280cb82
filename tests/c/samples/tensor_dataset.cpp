// tensor_dataset.cpp: the host-side objects a model program builds around its device buffers, in
// the style of the vendor's classification sample: tensor descriptors size the buffers, data
// buffers wrap device memory, datasets hold them in order; inputs go in by aclrtMemcpy, the output
// comes back the same way (the "model" here is a device-to-device copy, so the data can be
// checked). With "pause" it stops after aclInit (a "paused" line) until a line arrives on stdin,
// builds 20,000 host objects, prints "built" and waits again: the test stops the aclserver
// meanwhile, proving those calls need no server.
#include "acl/acl.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

static int g_failed = 0;

static void Check(bool ok, const char *what)
{
    std::printf("[%s] %s%s%s\n", ok ? "INFO" : "ERROR", what, ok ? "" : ": ",
                ok ? "" : (aclGetRecentErrMsg() ? aclGetRecentErrMsg() : "(no message)"));
    std::fflush(stdout);
    g_failed += ok ? 0 : 1;
}

static void WaitForLine()
{
    char line[16];
    if (!std::fgets(line, sizeof line, stdin))
        g_failed++;
}

// Many host objects, created and destroyed, with no aclserver round trip.
static void BuildMany()
{
    int64_t dims[] = {1, 3, 224, 224};
    for (int i = 0; i < 5000; i++) {
        aclTensorDesc *desc = aclCreateTensorDesc(ACL_FLOAT, 4, dims, ACL_FORMAT_NCHW);
        aclDataBuffer *buffer = aclCreateDataBuffer(nullptr, aclGetTensorDescSize(desc));
        aclmdlDataset *dataset = aclmdlCreateDataset();
        aclopAttr *attr = aclopCreateAttr();
        bool ok = desc && buffer && dataset && attr && aclmdlAddDatasetBuffer(dataset, buffer) == ACL_SUCCESS &&
                  aclmdlSetDatasetTensorDesc(dataset, desc, 0) == ACL_SUCCESS &&
                  aclopSetAttrInt(attr, "axis", i) == ACL_SUCCESS &&
                  aclFloat16ToFloat(aclFloatToFloat16(1.5f)) == 1.5f;
        if (!ok) {
            Check(false, "a host object");
            return;
        }
        aclopDestroyAttr(attr);
        aclmdlDestroyDataset(dataset);
        aclDestroyDataBuffer(buffer);
        aclDestroyTensorDesc(desc);
    }
    Check(true, "20,000 host objects built and destroyed");
}

// One input of the given shape and type: a descriptor, device memory of its size, a data buffer.
static aclDataBuffer *AddTensor(aclmdlDataset *dataset, aclDataType type, std::vector<int64_t> dims)
{
    aclTensorDesc *desc = aclCreateTensorDesc(type, static_cast<int>(dims.size()), dims.data(), ACL_FORMAT_ND);
    size_t size = aclGetTensorDescSize(desc);
    void *dev = nullptr;
    Check(desc && aclrtMalloc(&dev, size, ACL_MEM_MALLOC_HUGE_FIRST) == ACL_SUCCESS, "device memory for a tensor");
    aclDataBuffer *buffer = aclCreateDataBuffer(dev, size);
    Check(aclmdlAddDatasetBuffer(dataset, buffer) == ACL_SUCCESS, "add the buffer");
    size_t index = aclmdlGetDatasetNumBuffers(dataset) - 1;
    Check(aclmdlSetDatasetTensorDesc(dataset, desc, index) == ACL_SUCCESS, "describe the buffer");
    aclDestroyTensorDesc(desc);
    return buffer;
}

static void DestroyDataset(aclmdlDataset *dataset)
{
    for (size_t i = 0; i < aclmdlGetDatasetNumBuffers(dataset); i++) {
        aclDataBuffer *buffer = aclmdlGetDatasetBuffer(dataset, i);
        Check(aclrtFree(aclGetDataBufferAddr(buffer)) == ACL_SUCCESS, "free a tensor's device memory");
        aclDestroyDataBuffer(buffer);
    }
    Check(aclmdlDestroyDataset(dataset) == ACL_SUCCESS, "destroy a dataset");
}

int main(int argc, char **argv)
{
    bool pause = argc > 1 && std::string(argv[1]) == "pause";
    Check(aclInit(nullptr) == ACL_SUCCESS && aclrtSetDevice(0) == ACL_SUCCESS, "init and device 0");
    if (pause) {
        std::printf("paused\n");
        std::fflush(stdout);
        WaitForLine();
        BuildMany();
        std::printf("built\n");
        std::fflush(stdout);
        WaitForLine();
    }
    aclmdlDataset *input = aclmdlCreateDataset(), *output = aclmdlCreateDataset();
    aclDataBuffer *in16 = AddTensor(input, ACL_FLOAT16, {2, 3});
    AddTensor(input, ACL_INT8, {4});
    aclDataBuffer *out16 = AddTensor(output, ACL_FLOAT16, {6});
    aclTensorDesc *d0 = aclmdlGetDatasetTensorDesc(input, 0);
    Check(aclGetTensorDescElementCount(d0) == 6 && aclGetTensorDescType(d0) == ACL_FLOAT16, "input 0 describes 6 halves");
    Check(aclGetDataBufferSizeV2(in16) == 12 && aclGetDataBufferSizeV2(out16) == 12, "buffer sizes from descriptors");

    aclFloat16 values[6], back[6];
    for (int i = 0; i < 6; i++)
        values[i] = aclFloatToFloat16(0.25f * static_cast<float>(i) - 0.5f);
    Check(aclrtMemcpy(aclGetDataBufferAddr(in16), 12, values, sizeof values, ACL_MEMCPY_HOST_TO_DEVICE) == 0,
          "input to the device");
    Check(aclrtMemcpy(aclGetDataBufferAddr(out16), 12, aclGetDataBufferAddr(in16), 12,
                      ACL_MEMCPY_DEVICE_TO_DEVICE) == ACL_SUCCESS,
          "the \"model\": output = input");
    Check(aclrtMemcpy(back, sizeof back, aclGetDataBufferAddr(out16), 12, ACL_MEMCPY_DEVICE_TO_HOST) == 0,
          "output to the host");
    bool same = true;
    for (int i = 0; i < 6; i++)
        same = same && aclFloat16ToFloat(back[i]) == 0.25f * static_cast<float>(i) - 0.5f;
    Check(same, "the output values");
    DestroyDataset(input);
    DestroyDataset(output);
    size_t freeB = 0, total = 0;
    Check(aclrtGetMemInfo(ACL_HBM_MEM, &freeB, &total) == ACL_SUCCESS && freeB == total, "all memory returned");
    Check(aclFinalize() == ACL_SUCCESS, "acl finalize");
    std::printf("[INFO] %d failed\n", g_failed);
    return g_failed ? 1 : 0;
}
