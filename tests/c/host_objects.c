/*
 * host_objects.c: the host-side objects of libascendcl.so, used as a program would, with no
 * aclserver and no aclInit (they need neither). Run as `host_objects <scenario>`:
 *
 *   objects   data buffers, datasets, tensor descriptors, operator attributes, aclDataTypeSize:
 *             every getter and setter, and the bad arguments each refuses
 *   fp16      binary dump on stdout for tests/c/test_host_objects.py: for each of the 65,536
 *             halves h (ascending), float bits of aclFloat16ToFloat(h) (uint32 LE); then for each
 *             float in the list read from stdin (uint32 LE bits), aclFloatToFloat16 (uint16 LE)
 *   log       aclAppLog at each level, a long message, and a NULL format (stderr is the output)
 */
#include "check.h"

#include <acl/acl.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* the deprecated getters are served too */

static void data_buffers(void)
{
    char data[100];
    aclDataBuffer *b = aclCreateDataBuffer(data, sizeof data);
    CHECK(b != NULL, "create a data buffer");
    CHECK(aclGetDataBufferAddr(b) == data && aclGetDataBufferSizeV2(b) == 100 && aclGetDataBufferSize(b) == 100,
          "address and sizes");
    CALL(aclUpdateDataBuffer(b, data + 10, 5));
    CHECK(aclGetDataBufferAddr(b) == data + 10 && aclGetDataBufferSizeV2(b) == 5, "updated");
    CALL(aclUpdateDataBuffer(b, NULL, (size_t)1 << 40));
    CHECK(aclGetDataBufferSize(b) == 0 && aclGetDataBufferSizeV2(b) == (size_t)1 << 40,
          "the 32-bit size truncates a 2^40-byte buffer as CANN's does: %u", aclGetDataBufferSize(b));
    CALL(aclDestroyDataBuffer(b));
    aclDataBuffer *empty = aclCreateDataBuffer(NULL, 0);
    CHECK(empty && !aclGetDataBufferAddr(empty), "an empty data buffer");
    CALL(aclDestroyDataBuffer(empty));
    expect(aclDestroyDataBuffer(NULL), ACL_ERROR_INVALID_PARAM, "destroy NULL");
    expect(aclUpdateDataBuffer(NULL, data, 1), ACL_ERROR_INVALID_PARAM, "update NULL");
    CHECK(aclGetDataBufferAddr(NULL) == NULL && strstr(msg(), "aclGetDataBufferAddr"), "addr of NULL: %s", msg());
    CHECK(aclGetDataBufferSizeV2(NULL) == 0, "size of NULL");
    int not_a_buffer[8] = {0};
    expect(aclDestroyDataBuffer((aclDataBuffer *)not_a_buffer), ACL_ERROR_INVALID_PARAM, "destroy a foreign pointer");
}

static void data_type_sizes(void)
{
    static const struct {
        aclDataType t;
        size_t size;
    } sizes[] = {
        {ACL_FLOAT, 4},      {ACL_FLOAT16, 2},  {ACL_INT8, 1},         {ACL_INT32, 4},          {ACL_UINT8, 1},
        {ACL_INT16, 2},      {ACL_UINT16, 2},   {ACL_UINT32, 4},       {ACL_INT64, 8},          {ACL_UINT64, 8},
        {ACL_DOUBLE, 8},     {ACL_BOOL, 1},     {ACL_STRING, 0},       {ACL_COMPLEX64, 8},      {ACL_COMPLEX128, 16},
        {ACL_BF16, 2},       {ACL_INT4, 1},     {ACL_UINT1, 1},        {ACL_COMPLEX32, 4},      {ACL_HIFLOAT8, 1},
        {ACL_FLOAT8_E5M2, 1}, {ACL_FLOAT8_E4M3FN, 1}, {ACL_FLOAT8_E8M0, 1}, {ACL_DT_UNDEFINED, 0},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        if (aclDataTypeSize(sizes[i].t) != sizes[i].size) {
            printf("FAIL aclDataTypeSize(%d) = %zu, want %zu\n", (int)sizes[i].t, aclDataTypeSize(sizes[i].t),
                   sizes[i].size);
            bad++;
        }
    CHECK(bad == 0, "aclDataTypeSize of every listed type");
}

static void tensor_descs(void)
{
    int64_t dims[] = {2, 3, 4};
    aclTensorDesc *d = aclCreateTensorDesc(ACL_FLOAT16, 3, dims, ACL_FORMAT_NCHW);
    CHECK(d != NULL, "create a tensor desc");
    CHECK(aclGetTensorDescType(d) == ACL_FLOAT16 && aclGetTensorDescFormat(d) == ACL_FORMAT_NCHW, "type, format");
    CHECK(aclGetTensorDescNumDims(d) == 3 && aclGetTensorDescElementCount(d) == 24 && aclGetTensorDescSize(d) == 48,
          "dims %zu, elements %zu, size %zu", aclGetTensorDescNumDims(d), aclGetTensorDescElementCount(d),
          aclGetTensorDescSize(d));
    int64_t dim = 0;
    CALL(aclGetTensorDescDimV2(d, 2, &dim));
    CHECK(dim == 4 && aclGetTensorDescDim(d, 1) == 3, "dim 2 is 4, dim 1 is 3");
    expect(aclGetTensorDescDimV2(d, 3, &dim), ACL_ERROR_INVALID_PARAM, "dim 3 of 3");
    CHECK(aclGetTensorDescDim(d, 3) == -1, "the deprecated getter says -1");
    CHECK(strcmp(aclGetTensorDescName(d), "") == 0, "no name yet");
    aclSetTensorDescName(d, "input_0");
    CHECK(strcmp(aclGetTensorDescName(d), "input_0") == 0, "named");
    aclSetTensorDescName(d, NULL);
    CHECK(strcmp(aclGetTensorDescName(d), "") == 0, "a NULL name clears it");
    int64_t shape[] = {6, 4};
    CALL(aclSetTensorShape(d, 2, shape)); /* the storage shape: the origin shape is what getters report */
    CALL(aclSetTensorFormat(d, ACL_FORMAT_ND));
    CHECK(aclGetTensorDescNumDims(d) == 3 && aclGetTensorDescFormat(d) == ACL_FORMAT_NCHW,
          "storage shape and format do not change the origin ones");
    CALL(aclSetTensorOriginShape(d, 2, shape));
    CALL(aclSetTensorOriginFormat(d, ACL_FORMAT_NHWC));
    CHECK(aclGetTensorDescNumDims(d) == 2 && aclGetTensorDescElementCount(d) == 24 &&
              aclGetTensorDescFormat(d) == ACL_FORMAT_NHWC,
          "the origin shape and format");
    int64_t ranges[2][2] = {{1, 8}, {4, 4}};
    CALL(aclSetTensorShapeRange(d, 2, ranges));
    int64_t r[2] = {0, 0};
    CALL(aclGetTensorDescDimRange(d, 0, 2, r));
    CHECK(r[0] == 1 && r[1] == 8, "range 0 is [1, 8]: [%lld, %lld]", (long long)r[0], (long long)r[1]);
    expect(aclGetTensorDescDimRange(d, 2, 2, r), ACL_ERROR_INVALID_PARAM, "range 2 of 2");
    expect(aclGetTensorDescDimRange(d, 0, 1, r), ACL_ERROR_INVALID_PARAM, "a range buffer of one");
    CALL(aclSetTensorValueRange(d, 1, ranges));
    CALL(aclSetTensorDynamicInput(d, "x"));
    float c[4] = {1, 2, 3, 4};
    CALL(aclSetTensorConst(d, c, sizeof c));
    expect(aclSetTensorConst(d, c, 0), ACL_ERROR_INVALID_PARAM, "const of 0 bytes");
    CALL(aclSetTensorPlaceMent(d, ACL_MEMTYPE_HOST));
    expect(aclSetTensorPlaceMent(d, (aclMemType)9), ACL_ERROR_INVALID_PARAM, "placement 9");
    CHECK(aclGetTensorDescByIndex(d, 0) == d && aclGetTensorDescAddress(d) == NULL, "by index, address");
    CALL(aclSetTensorStorageFormat(d, ACL_FORMAT_NC1HWC0));
    CALL(aclSetTensorStorageShape(d, 2, shape));

    int64_t dyn[] = {-1, 3};
    aclTensorDesc *dynamic = aclCreateTensorDesc(ACL_INT32, 2, dyn, ACL_FORMAT_ND);
    CHECK(aclGetTensorDescElementCount(dynamic) == 0 && aclGetTensorDescSize(dynamic) == 0, "a dynamic dim");
    int64_t unknown[] = {-2};
    aclTensorDesc *rankless = aclCreateTensorDesc(ACL_INT32, 1, unknown, ACL_FORMAT_ND);
    CHECK(aclGetTensorDescNumDims(rankless) == ACL_UNKNOWN_RANK, "rank -2 is ACL_UNKNOWN_RANK");
    aclTensorDesc *scalar = aclCreateTensorDesc(ACL_DOUBLE, 0, NULL, ACL_FORMAT_ND);
    CHECK(scalar && aclGetTensorDescElementCount(scalar) == 1 && aclGetTensorDescSize(scalar) == 8, "a scalar");
    CHECK(aclCreateTensorDesc(ACL_FLOAT, -1, dims, ACL_FORMAT_ND) == NULL, "negative numDims: %s", msg());
    CHECK(aclCreateTensorDesc(ACL_FLOAT, 2, NULL, ACL_FORMAT_ND) == NULL, "dims NULL: %s", msg());
    CHECK(aclGetTensorDescType(NULL) == ACL_DT_UNDEFINED && aclGetTensorDescFormat(NULL) == ACL_FORMAT_UNDEFINED &&
              aclGetTensorDescNumDims(NULL) == 0 && strcmp(aclGetTensorDescName(NULL), "") == 0,
          "CANN's answers for a NULL desc");
    expect(aclSetTensorShape(NULL, 1, dims), ACL_ERROR_INVALID_PARAM, "shape of NULL");
    expect(aclSetTensorShape(d, 1, NULL), ACL_ERROR_INVALID_PARAM, "shape NULL dims");
    expect(aclSetTensorShapeRange(d, 2, NULL), ACL_ERROR_INVALID_PARAM, "ranges NULL");
    aclTensorDesc *out = NULL;
    expect(aclTransTensorDescFormat(d, ACL_FORMAT_ND, &out), ACL_ERROR_API_NOT_SUPPORT, "format transform");
    aclDestroyTensorDesc(dynamic);
    aclDestroyTensorDesc(rankless);
    aclDestroyTensorDesc(scalar);
    aclDestroyTensorDesc(d);
    aclDestroyTensorDesc(NULL);
}

static void datasets(void)
{
    aclmdlDataset *ds = aclmdlCreateDataset();
    CHECK(ds && aclmdlGetDatasetNumBuffers(ds) == 0, "an empty dataset");
    char a[16], b[32];
    aclDataBuffer *ba = aclCreateDataBuffer(a, sizeof a), *bb = aclCreateDataBuffer(b, sizeof b);
    CALL(aclmdlAddDatasetBuffer(ds, ba));
    CALL(aclmdlAddDatasetBuffer(ds, bb));
    CHECK(aclmdlGetDatasetNumBuffers(ds) == 2 && aclmdlGetDatasetBuffer(ds, 1) == bb, "two buffers, in order");
    CHECK(aclmdlGetDatasetBuffer(ds, 2) == NULL && strstr(msg(), "index 2"), "buffer 2 of 2: %s", msg());
    CHECK(aclmdlGetDatasetTensorDesc(ds, 0) == NULL, "no descriptor yet");
    int64_t dims[] = {4};
    aclTensorDesc *td = aclCreateTensorDesc(ACL_FLOAT, 1, dims, ACL_FORMAT_ND);
    CALL(aclmdlSetDatasetTensorDesc(ds, td, 0));
    aclDestroyTensorDesc(td); /* the dataset holds its own copy */
    aclTensorDesc *held = aclmdlGetDatasetTensorDesc(ds, 0);
    CHECK(held && aclGetTensorDescSize(held) == 16, "the dataset's copy outlives the original");
    CALL(aclmdlSetDatasetTensorDesc(ds, NULL, 0));
    CHECK(aclmdlGetDatasetTensorDesc(ds, 0) == NULL, "NULL removes it");
    td = aclCreateTensorDesc(ACL_INT8, 1, dims, ACL_FORMAT_ND);
    CALL(aclmdlSetDatasetTensorDesc(ds, td, 1));
    aclDestroyTensorDesc(td);
    expect(aclmdlSetDatasetTensorDesc(ds, NULL, 5), ACL_ERROR_INVALID_PARAM, "descriptor index 5");
    expect(aclmdlAddDatasetBuffer(ds, NULL), ACL_ERROR_INVALID_PARAM, "add NULL");
    expect(aclmdlAddDatasetBuffer(NULL, ba), ACL_ERROR_INVALID_PARAM, "add to NULL");
    for (int i = 0; i < 1000; i++) /* growth */
        aclmdlAddDatasetBuffer(ds, ba);
    CHECK(aclmdlGetDatasetNumBuffers(ds) == 1002, "1002 buffers");
    CALL(aclmdlDestroyDataset(ds)); /* frees its descriptors, not the buffers */
    CHECK(aclGetDataBufferAddr(ba) == a, "the buffers survive their dataset");
    CALL(aclDestroyDataBuffer(ba));
    CALL(aclDestroyDataBuffer(bb));
    expect(aclmdlDestroyDataset(NULL), ACL_ERROR_INVALID_PARAM, "destroy NULL");
    CHECK(aclmdlGetDatasetNumBuffers(NULL) == 0, "count of NULL");
}

static void op_attrs(void)
{
    aclopAttr *attr = aclopCreateAttr();
    CHECK(attr != NULL, "create an attribute set");
    CALL(aclopSetAttrBool(attr, "transpose_a", 1));
    CALL(aclopSetAttrInt(attr, "axis", -1));
    CALL(aclopSetAttrFloat(attr, "alpha", 0.5f));
    CALL(aclopSetAttrString(attr, "mode", "linear"));
    CALL(aclopSetAttrDataType(attr, "dst_type", ACL_FLOAT16));
    aclDataType types[] = {ACL_FLOAT, ACL_INT8};
    CALL(aclopSetAttrListDataType(attr, "types", 2, types));
    uint8_t bools[] = {1, 0, 1};
    CALL(aclopSetAttrListBool(attr, "flags", 3, bools));
    int64_t ints[] = {1, 2, 3, 4};
    CALL(aclopSetAttrListInt(attr, "perm", 4, ints));
    float floats[] = {0.1f, 0.2f};
    CALL(aclopSetAttrListFloat(attr, "scales", 2, floats));
    char first[] = "a";
    const char *strs[] = {first, "b"};
    CALL(aclopSetAttrListString(attr, "names", 2, strs));
    first[0] = 'z'; /* the attribute kept a copy */
    int counts[] = {2, 0, 1};
    int64_t l0[] = {1, 2}, l2[] = {3};
    const int64_t *lists[] = {l0, NULL, l2};
    CALL(aclopSetAttrListListInt(attr, "pads", 3, counts, lists));
    CALL(aclopSetAttrInt(attr, "axis", 2)); /* again: replaces */
    CALL(aclopSetAttrListInt(attr, "empty", 0, NULL));
    expect(aclopSetAttrInt(NULL, "axis", 1), ACL_ERROR_INVALID_PARAM, "set on NULL");
    expect(aclopSetAttrInt(attr, NULL, 1), ACL_ERROR_INVALID_PARAM, "NULL name");
    expect(aclopSetAttrListInt(attr, "perm", -1, ints), ACL_ERROR_INVALID_PARAM, "negative count");
    expect(aclopSetAttrListInt(attr, "perm", 2, NULL), ACL_ERROR_INVALID_PARAM, "NULL values");
    const char *holes[] = {"x", NULL};
    expect(aclopSetAttrListString(attr, "names", 2, holes), ACL_ERROR_INVALID_PARAM, "a NULL string");
    int bad_counts[] = {1, -3};
    expect(aclopSetAttrListListInt(attr, "pads", 2, bad_counts, lists), ACL_ERROR_INVALID_PARAM, "a negative list");
    aclopDestroyAttr(attr);
    aclopDestroyAttr(NULL);
}

static void scenario_objects(void)
{
    data_buffers();
    data_type_sizes();
    tensor_descs();
    datasets();
    op_attrs();
    expect(aclrtGetLastError(ACL_RT_THREAD_LEVEL), ACL_ERROR_INVALID_PARAM, "the last failure: destroying a NULL attr");
}

static void scenario_fp16(void)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = aclFloat16ToFloat((aclFloat16)h);
        uint32_t bits;
        memcpy(&bits, &f, sizeof bits);
        fwrite(&bits, sizeof bits, 1, stdout);
    }
    uint32_t bits;
    while (fread(&bits, sizeof bits, 1, stdin) == 1) {
        float f;
        memcpy(&f, &bits, sizeof f);
        aclFloat16 h = aclFloatToFloat16(f);
        fwrite(&h, sizeof h, 1, stdout);
    }
}

static void scenario_log(void)
{
    aclAppLog(ACL_DEBUG, "log_debug", "dir/host_objects.c", 10, "debug %d", 0);
    aclAppLog(ACL_INFO, "log_info", "host_objects.c", 11, "info %s", "one");
    aclAppLog(ACL_WARNING, "log_warning", "host_objects.c", 12, "warning %.1f", 2.5);
    ACL_APP_LOG(ACL_ERROR, "error %d", 3);
    aclAppLog((aclLogLevel)9, "log_bad", "host_objects.c", 13, "a level that does not exist");
    aclAppLog(ACL_ERROR, "log_null", "host_objects.c", 14, NULL);
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    aclAppLog(ACL_ERROR, "log_long", "host_objects.c", 15, "%s", big);
    printf("logged\n");
}

int main(int argc, char **argv)
{
    const char *s = argc > 1 ? argv[1] : "";
    if (!strcmp(s, "objects"))
        scenario_objects();
    else if (!strcmp(s, "fp16")) {
        scenario_fp16();
        return 0;
    } else if (!strcmp(s, "log"))
        scenario_log();
    else {
        fprintf(stderr, "usage: host_objects objects|fp16|log\n");
        return 2;
    }
    return finish();
}
