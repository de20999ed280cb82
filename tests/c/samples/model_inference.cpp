// model_inference.cpp: an inference program in the style of the vendor's classification sample
// (resnet50_firstapp): init, device, context and stream; the model's sizes, its device memory and
// its load; the description; input and output datasets of device buffers; N executions with the
// input copied in and the outputs copied out and checked; then everything released in reverse.
//
// The model is any model of FlexNPU's emulated format whose input 0 is float32 and whose output 0
// is input 0 * 2 + 1 (float32); output 1, if any, is summed and printed ("val out1_sum"), for the
// test to compare. Usage:
//   model_inference infer <model> <n> [file|mem|withmem|config] [sync|async|v2|v2-no-stream|async-v2]
//     (v2: aclmdlExecuteV2 on the stream with an execution config handle as the vendor's samples set
//     it up: a stream timeout and the work memory; v2-no-stream: the same without a stream;
//     async-v2: aclmdlExecuteAsyncV2 and a synchronize)
//   model_inference load <model>                 (load only: "val load_code")
//   model_inference tenant <model> <seconds>     (execute in a loop: "val executions")
#include "acl/acl.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

static int g_failed = 0;

static bool Ok(aclError ret, const char *what)
{
    if (ret != ACL_SUCCESS) {
        const char *m = aclGetRecentErrMsg();
        std::printf("[ERROR] %s failed, errorCode is %d: %s\n", what, static_cast<int>(ret), m ? m : "(no message)");
        g_failed++;
        return false;
    }
    return true;
}

struct Model {
    uint32_t id = 0;
    aclmdlDesc *desc = nullptr;
    void *work = nullptr, *weight = nullptr, *execWork = nullptr;
    size_t workSize = 0, weightSize = 0;
    std::vector<char> bytes; // the model in memory (mem, withmem from memory)
};

static aclError LoadModel(Model &m, const char *path, const std::string &how)
{
    if (how == "file")
        return aclmdlLoadFromFile(path, &m.id);
    if (how == "mem" || how == "config") {
        std::ifstream in(path, std::ios::binary);
        m.bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        if (how == "mem")
            return aclmdlLoadFromMem(m.bytes.data(), m.bytes.size(), &m.id);
        aclmdlConfigHandle *handle = aclmdlCreateConfigHandle();
        size_t type = ACL_MDL_LOAD_FROM_MEM;
        const void *addr = m.bytes.data();
        size_t size = m.bytes.size();
        aclError ret = aclmdlSetConfigOpt(handle, ACL_MDL_LOAD_TYPE_SIZET, &type, sizeof(type));
        if (ret == ACL_SUCCESS)
            ret = aclmdlSetConfigOpt(handle, ACL_MDL_MEM_ADDR_PTR, &addr, sizeof(addr));
        if (ret == ACL_SUCCESS)
            ret = aclmdlSetConfigOpt(handle, ACL_MDL_MEM_SIZET, &size, sizeof(size));
        if (ret == ACL_SUCCESS)
            ret = aclmdlLoadWithConfig(handle, &m.id);
        aclmdlDestroyConfigHandle(handle);
        return ret;
    }
    // withmem: the sample's way, the application owns the model's memory
    aclError ret = aclmdlQuerySize(path, &m.workSize, &m.weightSize);
    if (ret == ACL_SUCCESS && m.workSize)
        ret = aclrtMalloc(&m.work, m.workSize, ACL_MEM_MALLOC_HUGE_FIRST);
    if (ret == ACL_SUCCESS && m.weightSize)
        ret = aclrtMalloc(&m.weight, m.weightSize, ACL_MEM_MALLOC_HUGE_FIRST);
    if (ret == ACL_SUCCESS)
        ret = aclmdlLoadFromFileWithMem(path, &m.id, m.work, m.workSize, m.weight, m.weightSize);
    std::printf("val work_size %zu\nval weight_size %zu\n", m.workSize, m.weightSize);
    return ret;
}

// One dataset with a device buffer of each input's (or output's) size.
static aclmdlDataset *CreateDataset(aclmdlDesc *desc, bool outputs, std::vector<void *> &buffers)
{
    aclmdlDataset *dataset = aclmdlCreateDataset();
    size_t n = outputs ? aclmdlGetNumOutputs(desc) : aclmdlGetNumInputs(desc);
    for (size_t i = 0; i < n && dataset; i++) {
        size_t size = outputs ? aclmdlGetOutputSizeByIndex(desc, i) : aclmdlGetInputSizeByIndex(desc, i);
        void *dev = nullptr;
        if (!Ok(aclrtMalloc(&dev, size, ACL_MEM_MALLOC_HUGE_FIRST), "aclrtMalloc of a dataset buffer"))
            return dataset;
        buffers.push_back(dev);
        aclDataBuffer *buffer = aclCreateDataBuffer(dev, size);
        Ok(aclmdlAddDatasetBuffer(dataset, buffer), "aclmdlAddDatasetBuffer");
    }
    return dataset;
}

static void DestroyDataset(aclmdlDataset *dataset, std::vector<void *> &buffers)
{
    for (size_t i = 0; i < aclmdlGetDatasetNumBuffers(dataset); i++)
        aclDestroyDataBuffer(aclmdlGetDatasetBuffer(dataset, i));
    Ok(aclmdlDestroyDataset(dataset), "aclmdlDestroyDataset");
    for (void *dev : buffers)
        Ok(aclrtFree(dev), "aclrtFree of a dataset buffer");
}

static int Infer(const char *path, int n, const std::string &how, const std::string &exec, double seconds)
{
    if (!Ok(aclInit(nullptr), "aclInit") || !Ok(aclrtSetDevice(0), "aclrtSetDevice"))
        return 1;
    aclrtContext context = nullptr;
    aclrtStream stream = nullptr;
    Ok(aclrtCreateContext(&context, 0), "aclrtCreateContext");
    Ok(aclrtCreateStream(&stream), "aclrtCreateStream");
    std::printf("[INFO] acl init and device 0 ready\n");

    Model model;
    aclError ret = LoadModel(model, path, how);
    std::printf("val load_code %d\n", static_cast<int>(ret));
    if (ret != ACL_SUCCESS) {
        const char *m = aclGetRecentErrMsg();
        std::printf("val load_msg %s\n", m ? m : "");
        aclrtDestroyStream(stream);
        aclrtDestroyContext(context);
        aclrtResetDevice(0);
        aclFinalize();
        return n < 0 ? 0 : 1;
    }
    model.desc = aclmdlCreateDesc();
    Ok(aclmdlGetDesc(model.desc, model.id), "aclmdlGetDesc");
    aclmdlIODims dims;
    Ok(aclmdlGetInputDims(model.desc, 0, &dims), "aclmdlGetInputDims");
    size_t inputSize = aclmdlGetInputSizeByIndex(model.desc, 0);
    std::printf("val n_inputs %zu\nval n_outputs %zu\nval input_size %zu\nval input_name %s\nval input_dims %zu\n",
                aclmdlGetNumInputs(model.desc), aclmdlGetNumOutputs(model.desc), inputSize, dims.name,
                dims.dimCount);
    if (aclmdlGetInputDataType(model.desc, 0) != ACL_FLOAT || aclmdlGetOutputDataType(model.desc, 0) != ACL_FLOAT)
        Ok(ACL_ERROR_INVALID_PARAM, "the model's input 0 and output 0 are float32");

    std::vector<void *> inBufs, outBufs;
    aclmdlDataset *input = CreateDataset(model.desc, false, inBufs);
    aclmdlDataset *output = CreateDataset(model.desc, true, outBufs);
    size_t count = inputSize / sizeof(float);
    void *hostIn = nullptr, *hostOut = nullptr;
    Ok(aclrtMallocHost(&hostIn, inputSize), "aclrtMallocHost input");
    Ok(aclrtMallocHost(&hostOut, aclmdlGetOutputSizeByIndex(model.desc, 0)), "aclrtMallocHost output");
    aclmdlExecConfigHandle *config = nullptr;
    if (exec == "v2" || exec == "v2-no-stream" || exec == "async-v2") {
        config = aclmdlCreateExecConfigHandle();
        int32_t timeout = 60000;
        size_t workSize = 0, weightSize = 0;
        void *work = nullptr;
        Ok(aclmdlQuerySize(path, &workSize, &weightSize), "aclmdlQuerySize");
        Ok(aclrtMalloc(&work, workSize, ACL_MEM_MALLOC_HUGE_FIRST), "aclrtMalloc exec work");
        Ok(aclmdlSetExecConfigOpt(config, ACL_MDL_STREAM_SYNC_TIMEOUT, &timeout, sizeof(timeout)), "timeout opt");
        Ok(aclmdlSetExecConfigOpt(config, ACL_MDL_WORK_ADDR_PTR, &work, sizeof(work)), "work opt");
        Ok(aclmdlSetExecConfigOpt(config, ACL_MDL_WORK_SIZET, &workSize, sizeof(workSize)), "work size opt");
        model.execWork = work;
    }
    auto start = std::chrono::steady_clock::now();
    long executions = 0, checked = 0;
    if (seconds > 0) { // a tenant: two streams, one batch always queued while the other is waited for
        aclrtStream streams[2] = {stream, nullptr};
        Ok(aclrtCreateStream(&streams[1]), "aclrtCreateStream");
        for (int k = 0; g_failed == 0; k++) {
            for (int i = 0; i < 4; i++)
                Ok(aclmdlExecuteAsync(model.id, input, output, streams[k % 2]), "aclmdlExecuteAsync");
            if (k)
                Ok(aclrtSynchronizeStream(streams[(k + 1) % 2]), "aclrtSynchronizeStream");
            executions += 4;
            if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= seconds)
                break;
        }
        Ok(aclrtSynchronizeStream(streams[0]), "aclrtSynchronizeStream");
        Ok(aclrtSynchronizeStream(streams[1]), "aclrtSynchronizeStream");
        Ok(aclrtDestroyStream(streams[1]), "aclrtDestroyStream");
    }
    for (int iter = 0; g_failed == 0 && seconds <= 0; iter++) {
        if (iter >= n)
            break;
        float *in = static_cast<float *>(hostIn);
        for (size_t i = 0; i < count; i++)
            in[i] = static_cast<float>(i % 97) * 0.25f + static_cast<float>(iter);
        Ok(aclrtMemcpy(inBufs[0], inputSize, hostIn, inputSize, ACL_MEMCPY_HOST_TO_DEVICE), "aclrtMemcpy input");
        if (exec == "async") {
            Ok(aclmdlExecuteAsync(model.id, input, output, stream), "aclmdlExecuteAsync");
            Ok(aclrtSynchronizeStream(stream), "aclrtSynchronizeStream");
        } else if (exec == "v2" || exec == "v2-no-stream") {
            Ok(aclmdlExecuteV2(model.id, input, output, exec == "v2" ? stream : nullptr, config), "aclmdlExecuteV2");
        } else if (exec == "async-v2") {
            Ok(aclmdlExecuteAsyncV2(model.id, input, output, stream, config), "aclmdlExecuteAsyncV2");
            Ok(aclrtSynchronizeStream(stream), "aclrtSynchronizeStream");
        } else {
            Ok(aclmdlExecute(model.id, input, output), "aclmdlExecute");
        }
        executions++;
        size_t outSize = aclmdlGetOutputSizeByIndex(model.desc, 0);
        Ok(aclrtMemcpy(hostOut, outSize, outBufs[0], outSize, ACL_MEMCPY_DEVICE_TO_HOST), "aclrtMemcpy output");
        const float *out = static_cast<const float *>(hostOut);
        for (size_t i = 0; i < count; i++, checked++)
            if (out[i] != in[i] * 2.0f + 1.0f) {
                std::printf("[ERROR] output 0[%zu] is %f, want %f\n", i, out[i], in[i] * 2.0f + 1.0f);
                g_failed++;
                break;
            }
    }
    std::printf("val executions %ld\nval checked %ld\n", executions, checked);
    if (aclmdlGetNumOutputs(model.desc) > 1) {
        size_t size = aclmdlGetOutputSizeByIndex(model.desc, 1);
        std::vector<float> out1(size / sizeof(float));
        Ok(aclrtMemcpy(out1.data(), size, outBufs[1], size, ACL_MEMCPY_DEVICE_TO_HOST), "aclrtMemcpy output 1");
        double sum = 0;
        for (float v : out1)
            sum += v;
        std::printf("val out1_sum %.6f\n", sum);
    }

    if (config) {
        Ok(aclmdlDestroyExecConfigHandle(config), "aclmdlDestroyExecConfigHandle");
        Ok(aclrtFree(model.execWork), "aclrtFree exec work");
    }
    aclrtFreeHost(hostIn);
    aclrtFreeHost(hostOut);
    DestroyDataset(input, inBufs);
    DestroyDataset(output, outBufs);
    Ok(aclmdlUnload(model.id), "aclmdlUnload");
    Ok(aclmdlDestroyDesc(model.desc), "aclmdlDestroyDesc");
    if (model.work)
        Ok(aclrtFree(model.work), "aclrtFree work");
    if (model.weight)
        Ok(aclrtFree(model.weight), "aclrtFree weight");
    Ok(aclrtDestroyStream(stream), "aclrtDestroyStream");
    Ok(aclrtDestroyContext(context), "aclrtDestroyContext");
    Ok(aclrtResetDevice(0), "aclrtResetDevice");
    Ok(aclFinalize(), "aclFinalize");
    std::printf("[INFO] %d failed\n", g_failed);
    return g_failed ? 1 : 0;
}

int main(int argc, char **argv)
{
    std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "infer" && argc >= 4)
        return Infer(argv[2], std::atoi(argv[3]), argc > 4 ? argv[4] : "file", argc > 5 ? argv[5] : "sync", 0);
    if (mode == "load" && argc == 3)
        return Infer(argv[2], -1, "file", "sync", 0);
    if (mode == "tenant" && argc == 4)
        return Infer(argv[2], 0, "file", "sync", std::atof(argv[3]));
    std::fprintf(stderr, "usage: %s infer <model> <n> [file|mem|withmem|config] [sync|async|v2|v2-no-stream|async-v2]"
                         " | load <model> | "
                         "tenant <model> <seconds>\n", argv[0]);
    return 2;
}
