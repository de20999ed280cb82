/*
 * aclnn_objects.c: the aclnn API's host-side objects in the share's libopapi.so / libnnopbase.so
 * (include/aclnn/acl_meta.h), with no aclserver: tensors (view, strides, offset, storage), scalars,
 * arrays and lists, their getters and Destroy functions, and the executor a GetWorkspaceSize builds
 * (workspace size 0; a NULL or foreign parameter refused with CANN's 161001/161002, naming it).
 */
#include "check.h"

#include <aclnn/aclnn_base.h>
#include <aclnnop/aclnn_add.h>
#include <aclnnop/aclnn_cat.h>
#include <aclnnop/aclnn_layer_norm.h>
#include <aclnnop/aclnn_matmul.h>

#include <stdlib.h>
#include <string.h>

#define ACLNN_ERR_PARAM_NULLPTR 161001
#define ACLNN_ERR_PARAM_INVALID 161002

static int same(const int64_t *a, const int64_t *b, uint64_t n)
{
    return memcmp(a, b, n * sizeof *a) == 0;
}

static void tensors(void)
{
    int64_t view[2] = {2, 3}, strides[2] = {1, 2}, storage[1] = {8};
    float data[8] = {0};
    aclTensor *t = aclCreateTensor(view, 2, ACL_FLOAT, strides, 1, ACL_FORMAT_ND, storage, 1, data);
    CHECK(t != NULL, "aclCreateTensor of a transposed view");
    view[0] = 99; /* the tensor has its own copy */
    int64_t *got = NULL;
    uint64_t n = 0;
    CHECK(aclGetViewShape(t, &got, &n) == 0 && n == 2 && got[0] == 2 && got[1] == 3, "aclGetViewShape: [2, 3]");
    free(got);
    CHECK(aclGetViewStrides(t, &got, &n) == 0 && n == 2 && same(got, strides, 2), "aclGetViewStrides: [1, 2]");
    free(got);
    CHECK(aclGetStorageShape(t, &got, &n) == 0 && n == 1 && got[0] == 8, "aclGetStorageShape: [8]");
    free(got);
    int64_t offset = -1;
    CHECK(aclGetViewOffset(t, &offset) == 0 && offset == 1, "aclGetViewOffset: 1");
    aclDataType dt = ACL_DT_UNDEFINED;
    aclFormat fmt = ACL_FORMAT_UNDEFINED;
    CHECK(aclGetDataType(t, &dt) == 0 && dt == ACL_FLOAT, "aclGetDataType: ACL_FLOAT");
    CHECK(aclGetFormat(t, &fmt) == 0 && fmt == ACL_FORMAT_ND, "aclGetFormat: ND");
    void *addr = NULL;
    CHECK(aclGetRawTensorAddr(t, &addr) == 0 && addr == data, "aclGetRawTensorAddr: the storage's base");
    CHECK(aclSetRawTensorAddr(t, data + 4) == 0 && aclGetRawTensorAddr(t, &addr) == 0 && addr == data + 4,
          "aclSetRawTensorAddr moves it");
    int64_t v3[3] = {4, 5, 6};
    CHECK(aclInitTensor(t, v3, 3, ACL_INT64, NULL, 0, ACL_FORMAT_ND, storage, 1, data) == 0, "aclInitTensor");
    int64_t want_contiguous[3] = {30, 6, 1};
    CHECK(aclGetViewStrides(t, &got, &n) == 0 && n == 3 && same(got, want_contiguous, 3),
          "a NULL stride is contiguous: [30, 6, 1]");
    free(got);
    CHECK(aclGetViewShape(t, NULL, &n) == ACLNN_ERR_PARAM_NULLPTR, "aclGetViewShape(NULL out) -> 161001");
    CHECK(aclDestroyTensor(t) == 0, "aclDestroyTensor");
    CHECK(aclDestroyTensor(NULL) == 0, "aclDestroyTensor(NULL) does nothing");

    int64_t many[17] = {0};
    CHECK(aclCreateTensor(many, 17, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, storage, 1, data) == NULL,
          "17 dims: NULL");
    CHECK(aclCreateTensor(view, 2, ACL_FLOAT, NULL, -1, ACL_FORMAT_ND, storage, 1, data) == NULL,
          "a negative offset: NULL");
    int64_t negative[1] = {-2};
    CHECK(aclCreateTensor(negative, 1, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, storage, 1, data) == NULL,
          "a negative dim: NULL");
    CHECK(aclCreateTensor(NULL, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, storage, 1, data) == NULL,
          "NULL viewDims with 2 dims: NULL");
}

static void scalars_and_arrays(void)
{
    int64_t one = 1;
    aclScalar *s = aclCreateScalar(&one, ACL_INT64);
    CHECK(s != NULL, "aclCreateScalar(INT64 1)");
    CHECK(aclCreateScalar(NULL, ACL_FLOAT) == NULL, "aclCreateScalar(NULL): NULL");
    CHECK(aclCreateScalar(&one, ACL_STRING) == NULL, "aclCreateScalar of a dtype without a size: NULL");
    int64_t ints[3] = {3, -1, 7};
    aclIntArray *ia = aclCreateIntArray(ints, 3);
    uint64_t n = 0;
    CHECK(ia && aclGetIntArraySize(ia, &n) == 0 && n == 3, "aclCreateIntArray / aclGetIntArraySize: 3");
    float fl[2] = {0.5f, 2.0f};
    aclFloatArray *fa = aclCreateFloatArray(fl, 2);
    CHECK(fa && aclGetFloatArraySize(fa, &n) == 0 && n == 2, "aclCreateFloatArray: 2");
    bool bs[4] = {true, false, true, true};
    aclBoolArray *ba = aclCreateBoolArray(bs, 4);
    CHECK(ba && aclGetBoolArraySize(ba, &n) == 0 && n == 4, "aclCreateBoolArray: 4");
    aclIntArray *empty = aclCreateIntArray(NULL, 0);
    CHECK(empty && aclGetIntArraySize(empty, &n) == 0 && n == 0, "an empty aclIntArray");
    CHECK(aclCreateIntArray(NULL, 2) == NULL, "aclCreateIntArray(NULL, 2): NULL");
    /* an object of another kind is refused, not misread */
    CHECK(aclGetIntArraySize((const aclIntArray *)(const void *)fa, &n) == ACLNN_ERR_PARAM_INVALID,
          "aclGetIntArraySize of a float array -> 161002");
    CHECK(aclDestroyTensor((const aclTensor *)(const void *)ia) == ACLNN_ERR_PARAM_INVALID,
          "aclDestroyTensor of an int array -> 161002 (and the array lives on)");
    CHECK(aclGetIntArraySize(ia, &n) == 0 && n == 3, "the int array is intact");

    const aclScalar *two[2] = {s, s};
    aclScalarList *sl = aclCreateScalarList(two, 2);
    CHECK(sl && aclGetScalarListSize(sl, &n) == 0 && n == 2, "aclCreateScalarList: 2");
    CHECK(aclDestroyScalarList(sl) == 0, "aclDestroyScalarList (its copies)");
    CHECK(aclDestroyScalar(s) == 0 && aclDestroyIntArray(ia) == 0 && aclDestroyFloatArray(fa) == 0 &&
              aclDestroyBoolArray(ba) == 0 && aclDestroyIntArray(empty) == 0,
          "Destroy each");
}

static void lists(void)
{
    int64_t view[1] = {4};
    float a[4], b[4];
    aclTensor *ta = aclCreateTensor(view, 1, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, view, 1, a);
    aclTensor *tb = aclCreateTensor(view, 1, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, view, 1, b);
    const aclTensor *both[2] = {ta, tb};
    aclTensorList *list = aclCreateTensorList(both, 2);
    uint64_t n = 0;
    CHECK(list && aclGetTensorListSize(list, &n) == 0 && n == 2, "aclCreateTensorList: 2");
    aclDestroyTensor(ta); /* the list keeps its own copies */
    aclDestroyTensor(tb);
    int64_t dim0[1] = {8};
    aclTensor *out = aclCreateTensor(dim0, 1, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, dim0, 1, a);
    uint64_t ws = 99;
    aclOpExecutor *e = NULL;
    CALL(aclnnCatGetWorkspaceSize(list, 0, out, &ws, &e));
    CHECK(e != NULL && ws == 0, "aclnnCatGetWorkspaceSize after the tensors were destroyed: executor, workspace 0");
    CHECK(aclDestroyAclOpExecutor(e) == 0, "aclDestroyAclOpExecutor of one not launched");
    const aclTensor *with_null[2] = {out, NULL};
    aclTensorList *holey = aclCreateTensorList(with_null, 2);
    e = NULL;
    CHECK(aclnnCatGetWorkspaceSize(holey, 0, out, &ws, &e) == ACLNN_ERR_PARAM_NULLPTR && e == NULL,
          "a NULL tensor in the list -> 161001, no executor");
    CHECK(aclDestroyTensorList(list) == 0 && aclDestroyTensorList(holey) == 0, "aclDestroyTensorList");
    aclDestroyTensor(out);
}

static void executors(void)
{
    int64_t dims[2] = {2, 2};
    float x[4] = {0}, y[4] = {0};
    aclTensor *a = aclCreateTensor(dims, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, dims, 2, x);
    aclTensor *o = aclCreateTensor(dims, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, dims, 2, y);
    int64_t one = 1;
    aclScalar *alpha = aclCreateScalar(&one, ACL_INT64);
    uint64_t ws = 7;
    aclOpExecutor *e = NULL;
    CALL(aclnnAddGetWorkspaceSize(a, a, alpha, o, &ws, &e));
    CHECK(ws == 0 && e != NULL, "aclnnAddGetWorkspaceSize: workspace 0, an executor");
    CHECK(aclSetAclOpExecutorRepeatable(e) == 0, "aclSetAclOpExecutorRepeatable");
    CHECK(aclDestroyAclOpExecutor(e) == 0, "aclDestroyAclOpExecutor");

    e = NULL;
    CHECK(aclnnAddGetWorkspaceSize(a, NULL, alpha, o, &ws, &e) == ACLNN_ERR_PARAM_NULLPTR && e == NULL,
          "aclnnAdd with other NULL -> 161001, no executor");
    CHECK(aclnnAddGetWorkspaceSize(a, a, (const aclScalar *)(const void *)a, o, &ws, &e) == ACLNN_ERR_PARAM_INVALID,
          "aclnnAdd with a tensor as alpha -> 161002");
    CHECK(aclnnAddGetWorkspaceSize(a, a, alpha, o, NULL, &e) == ACLNN_ERR_PARAM_NULLPTR,
          "aclnnAdd with workspaceSize NULL -> 161001");

    int64_t norm[1] = {2};
    aclIntArray *shape = aclCreateIntArray(norm, 1);
    e = NULL;
    CALL(aclnnLayerNormGetWorkspaceSize(a, shape, NULL, NULL, 1e-5, o, NULL, NULL, &ws, &e));
    CHECK(e != NULL, "aclnnLayerNorm with every optional tensor NULL: an executor");
    aclDestroyAclOpExecutor(e);

    /* launching needs the share: without client.conf the launch fails and names no success */
    e = NULL;
    CALL(aclnnMatmulGetWorkspaceSize(a, a, o, 0, &ws, &e));
    int launched = aclnnMatmul(NULL, 0, e, NULL);
    CHECK(launched != 0, "aclnnMatmul with no share to send to -> %d (not 0)", launched);
    CHECK(aclnnAdd(NULL, 0, NULL, NULL) == ACLNN_ERR_PARAM_NULLPTR, "aclnnAdd(NULL executor) -> 161001");

    CHECK(aclnnInit(NULL) == 0 && aclnnFinalize() == 0, "aclnnInit / aclnnFinalize answer success");
    aclDestroyScalar(alpha);
    aclDestroyIntArray(shape);
    aclDestroyTensor(a);
    aclDestroyTensor(o);
}

int main(void)
{
    tensors();
    scalars_and_arrays();
    lists();
    executors();
    printf("val failures %d\n", failures);
    return failures ? 1 : 0;
}
