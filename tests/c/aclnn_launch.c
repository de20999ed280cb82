/*
 * aclnn_launch.c: aclnn functions on a share (issue 24 item 3), as torch_npu calls them when the share's
 * libopapi.so is loaded: tensors from aclCreateTensor (view dims, strides, offset, storage), scalars from
 * aclCreateScalar, GetWorkspaceSize on the calling thread, the launch queued on an asynchronous stream,
 * results read back after a synchronize. A strided view is written in place; a tensor list feeds
 * aclnnCat; optional tensors are NULL; a shape the operator refuses is the stream's error at the next
 * synchronize, naming the function, and the stream goes on.
 */
#include "check.h"

#include <aclnn/aclnn_base.h>
#include <aclnnop/aclnn_add.h>
#include <aclnnop/aclnn_cat.h>
#include <aclnnop/aclnn_copy.h>
#include <aclnnop/aclnn_flash_attention_score.h>
#include <aclnnop/aclnn_layer_norm.h>
#include <aclnnop/aclnn_matmul.h>
#include <aclnnop/aclnn_ones.h>
#include <aclnnop/aclnn_softmax.h>

#include <math.h>
#include <string.h>

static aclrtStream stream;

static void *device(const float *host, size_t n)
{
    void *p = NULL;
    CALL(aclrtMalloc(&p, n * sizeof(float), ACL_MEM_MALLOC_HUGE_FIRST));
    if (host)
        CALL(aclrtMemcpy(p, n * sizeof(float), host, n * sizeof(float), ACL_MEMCPY_HOST_TO_DEVICE));
    else
        CALL(aclrtMemset(p, n * sizeof(float), 0, n * sizeof(float)));
    return p;
}

#include "aclnn_helpers.h"

static int close_to(const float *got, const float *want, int n, float tol)
{
    for (int i = 0; i < n; i++)
        if (!(fabsf(got[i] - want[i]) <= tol)) {
            printf("  [%d] got %g want %g\n", i, (double)got[i], (double)want[i]);
            return 0;
        }
    return 1;
}

int main(void)
{
    CALL(aclInit(NULL));
    CALL(aclrtSetDevice(0));
    CALL(aclnnInit(NULL));
    CALL(aclrtCreateStreamWithConfig(&stream, 0, 3));

    float a[6] = {1, 2, 3, 4, 5, 6}, got[12], want[12];
    int64_t d23[2] = {2, 3}, d32[2] = {3, 2}, d22[2] = {2, 2};
    void *da = device(a, 6), *dout = device(NULL, 12), *dmm = device(NULL, 4);
    aclTensor *ta = tensor(da, 2, d23), *tout = tensor(dout, 2, d23);

    /* torch.ones: aclnnInplaceOne */
    LAUNCH(aclnnInplaceOne, tout);
    read_back(got, dout, 6);
    for (int i = 0; i < 6; i++)
        want[i] = 1;
    CHECK(close_to(got, want, 6, 0), "aclnnInplaceOne wrote ones");

    /* x + 1: aclnnAdds with INT64 scalars, as torch_npu makes them */
    int64_t one = 1;
    aclScalar *s1 = aclCreateScalar(&one, ACL_INT64);
    LAUNCH(aclnnAdds, ta, s1, s1, tout);
    read_back(got, dout, 6);
    for (int i = 0; i < 6; i++)
        want[i] = a[i] + 1;
    CHECK(close_to(got, want, 6, 0), "aclnnAdds(a, 1, alpha 1) = a + 1");

    /* a @ a^T: aclnnMatmul with mat2 a transposed view (strides (1, 3)) of a's storage */
    int64_t tstrides[2] = {1, 3}, six = 6;
    aclTensor *at = aclCreateTensor(d32, 2, ACL_FLOAT, tstrides, 0, ACL_FORMAT_ND, &six, 1, da);
    aclTensor *tmm = tensor(dmm, 2, d22);
    LAUNCH(aclnnMatmul, ta, at, tmm, (int8_t)0);
    read_back(got, dmm, 4);
    float mm[4] = {14, 32, 32, 77};
    CHECK(close_to(got, mm, 4, 1e-5f), "aclnnMatmul(a, a^T as a strided view) = [[14, 32], [32, 77]]");

    /* softmax over the last dim */
    LAUNCH(aclnnSoftmax, ta, (int64_t)-1, tout);
    read_back(got, dout, 6);
    for (int r = 0; r < 2; r++) {
        float sum = 0;
        for (int c = 0; c < 3; c++)
            sum += expf(a[r * 3 + c] - a[r * 3 + 2]);
        for (int c = 0; c < 3; c++)
            want[r * 3 + c] = expf(a[r * 3 + c] - a[r * 3 + 2]) / sum;
    }
    CHECK(close_to(got, want, 6, 1e-6f), "aclnnSoftmax(dim -1)");

    /* layer norm without weight, bias, mean or rstd (every optional tensor NULL) */
    int64_t norm[1] = {3};
    aclIntArray *shape = aclCreateIntArray(norm, 1);
    LAUNCH(aclnnLayerNorm, ta, shape, NULL, NULL, 1e-5, tout, NULL, NULL);
    read_back(got, dout, 6);
    float z = 1.0f / sqrtf(2.0f / 3.0f + 1e-5f);
    float ln[6] = {-z, 0, z, -z, 0, z};
    CHECK(close_to(got, ln, 6, 1e-5f), "aclnnLayerNorm with the optional tensors NULL");

    /* weight and bias given, meanOutOptional NULL, rstdOutOptional given: the rstd lands in its own tensor */
    float w3[3] = {2, 2, 2}, b3[3] = {1, 1, 1}, rstd[2];
    int64_t d3[1] = {3}, d21[2] = {2, 1};
    void *dw = device(w3, 3), *db = device(b3, 3), *drstd = device(NULL, 2);
    aclTensor *tw = tensor(dw, 1, d3), *tb = tensor(db, 1, d3), *trstd = tensor(drstd, 2, d21);
    LAUNCH(aclnnLayerNorm, ta, shape, tw, tb, 1e-5, tout, NULL, trstd);
    read_back(got, dout, 6);
    for (int i = 0; i < 6; i++)
        want[i] = 2 * ln[i] + 1;
    CHECK(close_to(got, want, 6, 1e-5f), "aclnnLayerNorm with weight and bias");
    read_back(rstd, drstd, 2);
    float rstd_want[2] = {z, z};
    CHECK(close_to(rstd, rstd_want, 2, 1e-5f), "rstdOutOptional with meanOutOptional NULL holds the rstd (%g)",
          (double)rstd[0]);
    aclDestroyTensor(tw), aclDestroyTensor(tb), aclDestroyTensor(trstd);
    CALL(aclrtFree(dw));
    CALL(aclrtFree(db));
    CALL(aclrtFree(drstd));

    /* cat of a tensor list along dim 0 into a [4, 3] tensor */
    int64_t d43[2] = {4, 3};
    aclTensor *t43 = tensor(dout, 2, d43);
    const aclTensor *two[2] = {ta, ta};
    aclTensorList *list = aclCreateTensorList(two, 2);
    LAUNCH(aclnnCat, list, (int64_t)0, t43);
    read_back(got, dout, 12);
    memcpy(want, a, sizeof a);
    memcpy(want + 6, a, sizeof a);
    CHECK(close_to(got, want, 12, 0), "aclnnCat([a, a], 0)");

    /* copy into a strided view: column 1 of a [4, 3] buffer (offset 1, stride 3) takes a's first row... */
    CALL(aclrtMemset(dout, 12 * sizeof(float), 0, 12 * sizeof(float)));
    int64_t col[1] = {3}, col_stride[1] = {3}, twelve = 12, row[1] = {3};
    aclTensor *column = aclCreateTensor(col, 1, ACL_FLOAT, col_stride, 1, ACL_FORMAT_ND, &twelve, 1, dout);
    aclTensor *first_row = aclCreateTensor(row, 1, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, &six, 1, da);
    LAUNCH(aclnnInplaceCopy, column, first_row);
    read_back(got, dout, 12);
    float strided[12] = {0, 1, 0, 0, 2, 0, 0, 3, 0, 0, 0, 0};
    CHECK(close_to(got, strided, 12, 0), "aclnnInplaceCopy wrote exactly the strided view's elements");

    /* fused attention (torch's scaled_dot_product_attention): a zero query weighs the keys alike, so each
       output row is the mean of the value rows; a string (the layout) and a NULL optional array (prefix) */
    float zq[4] = {0}, vv[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, stats[8], att[4];
    int64_t q_dims[4] = {1, 1, 1, 4}, kv_dims[4] = {1, 1, 3, 4}, st_dims[4] = {1, 1, 1, 8}, none_dims[1] = {0};
    void *dq = device(zq, 4), *dk = device(vv, 12), *dv = device(vv, 12), *dmax = device(NULL, 8),
         *dsum = device(NULL, 8), *datt = device(NULL, 4);
    aclTensor *tq = tensor(dq, 4, q_dims), *tk = tensor(dk, 4, kv_dims), *tv = tensor(dv, 4, kv_dims),
              *tmax = tensor(dmax, 4, st_dims), *tsum = tensor(dsum, 4, st_dims), *tatt = tensor(datt, 4, q_dims),
              *tnone = tensor(NULL, 1, none_dims);
    char layout[] = "BNSD";
    LAUNCH(aclnnFlashAttentionScore, tq, tk, tv, NULL, NULL, NULL, NULL, NULL, 0.5, 1.0, (int64_t)2147483647,
           (int64_t)2147483647, (int64_t)1, layout, (int64_t)0, (int64_t)0, tmax, tsum, tnone, tatt);
    read_back(att, datt, 4);
    float mean_rows[4] = {5, 6, 7, 8};
    CHECK(close_to(att, mean_rows, 4, 1e-5f), "aclnnFlashAttentionScore: the mean of the value rows");
    read_back(stats, dsum, 8);
    CHECK(fabsf(stats[0] - 3.0f) < 1e-5f && fabsf(stats[7] - 3.0f) < 1e-5f, "softmaxSumOut: 3 keys of weight 1 (%g)",
          (double)stats[0]);
    aclTensor *fa[8] = {tq, tk, tv, tmax, tsum, tatt, tnone, NULL};
    for (int i = 0; fa[i]; i++)
        aclDestroyTensor(fa[i]);
    void *fa_mem[6] = {dq, dk, dv, dmax, dsum, datt};
    for (int i = 0; i < 6; i++)
        CALL(aclrtFree(fa_mem[i]));

    /* a shape the operator refuses: launched, then the stream's error at the synchronize */
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    CALL(aclnnMatmulGetWorkspaceSize(ta, ta, tmm, 0, &ws, &ex));
    CALL(aclnnMatmul(NULL, ws, ex, stream));
    rc = aclrtSynchronizeStream(stream);
    CHECK(rc == 100021 && strstr(msg(), "aclnnMatmul") && strstr(msg(), "[2, 3] and [2, 3]"),
          "aclnnMatmul of [2,3]x[2,3]: the stream's error %d %s", rc, msg());
    printf("val mismatch_code %d\n", rc);
    LAUNCH(aclnnAdds, ta, s1, s1, tout); /* the stream goes on */
    read_back(got, dout, 6);
    CHECK(got[5] == 7.0f, "the stream still runs: a[5] + 1 = %g", (double)got[5]);

    aclDestroyTensorList(list);
    aclDestroyIntArray(shape);
    aclDestroyScalar(s1);
    aclTensor *all[8] = {ta, tout, at, tmm, t43, column, first_row, NULL};
    for (int i = 0; all[i]; i++)
        aclDestroyTensor(all[i]);
    CALL(aclrtFree(da));
    CALL(aclrtFree(dout));
    CALL(aclrtFree(dmm));
    CALL(aclrtDestroyStream(stream));
    CALL(aclrtResetDevice(0));
    CALL(aclFinalize());
    return finish();
}
