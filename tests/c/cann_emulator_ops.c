/*
 * cann_emulator_ops.c (included by cann_emulator.c, whose allocation table, counters and error text it
 * shares): what the ascend backend forwards beyond memory and models, with CANN's prototypes.
 *
 * - Streams: aclrtCreateStream / aclrtSynchronizeStream / aclrtDestroyStream (work runs at launch).
 * - Single operators: aclCreateTensorDesc, aclSetTensorPlaceMent, aclCreateDataBuffer (cann_emulator.c's), aclopCreateAttr and
 *   the aclopSetAttr* setters, aclopCompileAndExecute and aclopExecuteV2. Computed: "Add" (float32, an input
 *   of one element broadcast) and "MatMul" (float32 2-D, attributes transpose_x1/transpose_x2); any other op
 *   type is refused with ACL_ERROR_OP_NOT_FOUND (100024) naming it, as CANN refuses an op it has no kernel for.
 * - aclnn: aclCreateTensor/Scalar/IntArray/TensorList and their destroys, aclnnAdds (asks for a 4 KiB workspace,
 *   which the launch checks is device memory on the stream's call), aclnnMatmul (no workspace; a shape mismatch
 *   is refused by GetWorkspaceSize with ACLNN_ERR_PARAM_INVALID 161002), both over strided float32 views, and
 *   aclnnCat of a tensor list along dim 0.
 * - Virtual memory: aclrtReserveMemAddress (host RAM, not counted as used), aclrtMallocPhysical (counted, no
 *   memory of its own), aclrtMapMem / aclrtUnmapMem (a range's bytes are addressable where mapped; they live
 *   in the range, not the handle), aclrtReleaseMemAddress, aclrtFreePhysical.
 *
 * Every launch appends one line to a log (test hook emu_op_log(), and the file FLEXNPU_EMU_LOG names): the op, each operand's dtype, dims,
 * strides and placement, the attributes with their setter kind, the workspace and the stream's number.
 */

#define EMU_MAGIC 0x454d5530u
#define MAX_DIMS 16
#define MAX_ATTRS 32
#define MAX_STREAMS 64
#define MAX_MAPS 256
#define ADDS_WORKSPACE 4096

static char oplog[16384];
static size_t oplog_len;
static pthread_mutex_t logmu = PTHREAD_MUTEX_INITIALIZER;

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&logmu);
    size_t at = oplog_len;
    int n = vsnprintf(oplog + oplog_len, sizeof oplog - oplog_len, fmt, ap);
    va_end(ap);
    if (n > 0)
        oplog_len = oplog_len + (size_t)n < sizeof oplog ? oplog_len + (size_t)n : sizeof oplog - 1;
    const char *path = getenv("FLEXNPU_EMU_LOG"); /* the log of an emulator inside another process */
    FILE *f = path ? fopen(path, "a") : NULL;
    if (f) {
        fputs(oplog + at, f);
        fclose(f);
    }
    pthread_mutex_unlock(&logmu);
}

EXPORT const char *emu_op_log(void);
EXPORT const char *emu_op_log(void)
{
    return oplog;
}

/* -- streams ---------------------------------------------------------------------------------------- */

struct emu_stream {
    unsigned magic;
    int id;
};
static struct emu_stream *streams[MAX_STREAMS];
static int stream_ids;

static int stream_id(void *s)
{
    for (int i = 0; i < MAX_STREAMS; i++)
        if (streams[i] && streams[i] == s)
            return streams[i]->id;
    return -1;
}

EXPORT int emu_streams(void);
EXPORT int emu_streams(void)
{
    int n = 0;
    for (int i = 0; i < MAX_STREAMS; i++)
        n += streams[i] != NULL;
    return n;
}

EXPORT int aclrtCreateStream(void **stream);
EXPORT int aclrtCreateStream(void **stream)
{
    int code = enter("aclrtCreateStream");
    if (code)
        return code;
    if (current < 0)
        return fail(107002, "no device set in this thread");
    pthread_mutex_lock(&mu);
    int rc = fail(207001, "too many streams");
    for (int i = 0; i < MAX_STREAMS; i++)
        if (!streams[i]) {
            streams[i] = calloc(1, sizeof *streams[i]);
            streams[i]->magic = EMU_MAGIC;
            streams[i]->id = ++stream_ids;
            *stream = streams[i];
            rc = 0;
            break;
        }
    pthread_mutex_unlock(&mu);
    return rc;
}

EXPORT int aclrtSynchronizeStream(void *stream);
EXPORT int aclrtSynchronizeStream(void *stream)
{
    int code = enter("aclrtSynchronizeStream");
    if (code)
        return code;
    return stream_id(stream) < 0 ? fail(107000, "EE1001: invalid stream") : 0;
}

EXPORT int aclrtDestroyStream(void *stream);
EXPORT int aclrtDestroyStream(void *stream)
{
    int code = enter("aclrtDestroyStream");
    if (code)
        return code;
    pthread_mutex_lock(&mu);
    int rc = fail(107000, "EE1001: invalid stream");
    for (int i = 0; i < MAX_STREAMS; i++)
        if (streams[i] && streams[i] == stream) {
            free(streams[i]);
            streams[i] = NULL;
            rc = 0;
        }
    pthread_mutex_unlock(&mu);
    return rc;
}

/* -- single operators ------------------------------------------------------------------------------- */

struct emu_tdesc {
    unsigned magic;
    int dtype, ndim, format, placement;
    int64_t dims[MAX_DIMS];
};
struct emu_attr_entry {
    char name[64];
    char kind; /* b i f s t: bool int float string dtype; upper case: a list of them; L: list of int lists */
    int count;
    int64_t i;
    double f;
};
struct emu_attr {
    unsigned magic;
    int n;
    struct emu_attr_entry e[MAX_ATTRS];
};

EXPORT void *aclCreateTensorDesc(int dtype, int numDims, const int64_t *dims, int format);
EXPORT void *aclCreateTensorDesc(int dtype, int numDims, const int64_t *dims, int format)
{
    (void)enter("aclCreateTensorDesc");
    if (numDims < 0 || numDims > MAX_DIMS || (numDims && !dims))
        return NULL;
    struct emu_tdesc *d = calloc(1, sizeof *d);
    *d = (struct emu_tdesc){EMU_MAGIC, dtype, numDims, format, 0, {0}};
    if (numDims)
        memcpy(d->dims, dims, sizeof(int64_t) * (size_t)numDims);
    return d;
}

EXPORT void aclDestroyTensorDesc(const void *desc);
EXPORT void aclDestroyTensorDesc(const void *desc)
{
    (void)enter("aclDestroyTensorDesc");
    free((void *)(uintptr_t)desc);
}

EXPORT int aclSetTensorPlaceMent(void *desc, int memType);
EXPORT int aclSetTensorPlaceMent(void *desc, int memType)
{
    (void)enter("aclSetTensorPlaceMent");
    struct emu_tdesc *d = desc;
    if (!d || d->magic != EMU_MAGIC || memType < 0 || memType > 2)
        return fail(100000, "aclSetTensorPlaceMent: bad descriptor or memType");
    d->placement = memType;
    return 0;
}

EXPORT void *aclopCreateAttr(void);
EXPORT void *aclopCreateAttr(void)
{
    (void)enter("aclopCreateAttr");
    struct emu_attr *a = calloc(1, sizeof *a);
    a->magic = EMU_MAGIC;
    return a;
}

EXPORT void aclopDestroyAttr(const void *attr);
EXPORT void aclopDestroyAttr(const void *attr)
{
    (void)enter("aclopDestroyAttr");
    free((void *)(uintptr_t)attr);
}

static struct emu_attr_entry *attr_slot(void *attr, const char *name, char kind)
{
    struct emu_attr *a = attr;
    if (!a || a->magic != EMU_MAGIC || !name || a->n >= MAX_ATTRS)
        return NULL;
    struct emu_attr_entry *e = &a->e[a->n++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->kind = kind;
    return e;
}

#define SCALAR_SETTER(fn, ctype, kind, field)                                                                    \
    EXPORT int fn(void *attr, const char *name, ctype v);                                                      \
    EXPORT int fn(void *attr, const char *name, ctype v)                                                       \
    {                                                                                                            \
        struct emu_attr_entry *e = attr_slot(attr, name, kind);                                                  \
        if (!e)                                                                                                  \
            return fail(100000, #fn ": bad attr");                                                               \
        e->field = v;                                                                                            \
        return 0;                                                                                                \
    }
SCALAR_SETTER(aclopSetAttrBool, uint8_t, 'b', i)
SCALAR_SETTER(aclopSetAttrInt, int64_t, 'i', i)
SCALAR_SETTER(aclopSetAttrFloat, float, 'f', f)
SCALAR_SETTER(aclopSetAttrDataType, int, 't', i)

EXPORT int aclopSetAttrString(void *attr, const char *name, const char *v);
EXPORT int aclopSetAttrString(void *attr, const char *name, const char *v)
{
    struct emu_attr_entry *e = attr_slot(attr, name, 's');
    if (!e || !v)
        return fail(100000, "aclopSetAttrString: bad attr");
    e->count = (int)strlen(v);
    return 0;
}

/* a list: its count, and its first value (a number) */
#define LIST_SETTER(fn, ctype, kind)                                                                             \
    EXPORT int fn(void *attr, const char *name, int n, const ctype *v);                                         \
    EXPORT int fn(void *attr, const char *name, int n, const ctype *v)                                          \
    {                                                                                                            \
        struct emu_attr_entry *e = attr_slot(attr, name, kind);                                                  \
        if (!e || n < 0 || (n && !v))                                                                            \
            return fail(100000, #fn ": bad attr");                                                               \
        e->count = n;                                                                                            \
        e->f = n ? (double)v[0] : 0;                                                                             \
        return 0;                                                                                                \
    }
LIST_SETTER(aclopSetAttrListBool, uint8_t, 'B')
LIST_SETTER(aclopSetAttrListInt, int64_t, 'I')
LIST_SETTER(aclopSetAttrListFloat, float, 'F')
LIST_SETTER(aclopSetAttrListDataType, int, 'T')

EXPORT int aclopSetAttrListString(void *attr, const char *name, int n, const char **v);
EXPORT int aclopSetAttrListString(void *attr, const char *name, int n, const char **v)
{
    struct emu_attr_entry *e = attr_slot(attr, name, 'S');
    if (!e || n < 0 || (n && !v))
        return fail(100000, "aclopSetAttrListString: bad attr");
    e->count = n;
    return 0;
}

EXPORT int aclopSetAttrListListInt(void *attr, const char *name, int n, const int *counts, const int64_t *const v[]);
EXPORT int aclopSetAttrListListInt(void *attr, const char *name, int n, const int *counts, const int64_t *const v[])
{
    struct emu_attr_entry *e = attr_slot(attr, name, 'L');
    if (!e || n < 0 || (n && (!counts || !v)))
        return fail(100000, "aclopSetAttrListListInt: bad attr");
    e->count = n;
    e->i = n ? counts[0] : 0;
    return 0;
}

static const struct emu_attr_entry *attr_get(const struct emu_attr *a, const char *name)
{
    for (int i = 0; a && i < a->n; i++)
        if (!strcmp(a->e[i].name, name))
            return &a->e[i];
    return NULL;
}

static int64_t numel(const int64_t *dims, int ndim)
{
    int64_t n = 1;
    for (int k = 0; k < ndim; k++)
        n *= dims[k];
    return n;
}

static void log_desc(const struct emu_tdesc *d, const struct emu_buffer *b)
{
    if (d->dtype == -1 && d->format == -1) {
        logf_(" undefined");
        return;
    }
    logf_(" d%d[", d->dtype);
    for (int k = 0; k < d->ndim; k++)
        logf_("%s%lld", k ? "," : "", (long long)d->dims[k]);
    logf_("]%s", d->placement ? "host" : "dev");
    (void)b;
}

/* check one operand: a descriptor and a buffer that holds its bytes, in device memory unless placed on the host */
static int operand(const char *op, const void *desc, const void *buf, int output)
{
    const struct emu_tdesc *d = desc;
    const struct emu_buffer *b = buf;
    if (!d || d->magic != EMU_MAGIC || !b)
        return fail(100000, "an operand's descriptor or buffer is not one aclCreate* made");
    if (d->dtype == -1 && d->ndim == 0 && d->format == -1 && !b->data && !output)
        return 0; /* CANN's placeholder of an optional input left out */
    if (d->dtype != 0)
        return fail(100026, "the emulator computes float32 only");
    if ((size_t)numel(d->dims, d->ndim) * 4 > b->size)
        return fail(100000, "a buffer is smaller than its descriptor");
    pthread_mutex_lock(&mu);
    int dev = find(b->data, b->size) != NULL;
    pthread_mutex_unlock(&mu);
    if (d->placement == 0 && !dev) {
        snprintf(err, sizeof err, "EE1005: %s: a device operand is not device memory", op);
        return 107000;
    }
    if (d->placement != 0 && (dev || output))
        return fail(100000, "a host-placed operand must be host memory and an input");
    return 0;
}

static int op_exec(const char *fn, const char *op, int nin, const void *const idesc[], const void *const ibuf[],
                   int nout, const void *const odesc[], void *const obuf[], const void *attr, void *stream)
{
    int code = enter(fn);
    if (code)
        return code;
    int sid = stream_id(stream);
    if (!op || sid < 0)
        return fail(100000, "EE1001: opType is NULL or the stream is not one aclrtCreateStream made");
    const struct emu_attr *a = attr;
    if (a && a->magic != EMU_MAGIC)
        return fail(100000, "attr is not one aclopCreateAttr made");
    for (int i = 0; i < nin; i++)
        if ((code = operand(op, idesc[i], ibuf[i], 0)))
            return code;
    for (int i = 0; i < nout; i++)
        if ((code = operand(op, odesc[i], obuf[i], 1)))
            return code;
    logf_("%s %s in", fn, op);
    for (int i = 0; i < nin; i++)
        log_desc(idesc[i], ibuf[i]);
    logf_(" out");
    for (int i = 0; i < nout; i++)
        log_desc(odesc[i], obuf[i]);
    logf_(" attrs");
    for (int i = 0; a && i < a->n; i++)
        logf_(" %s:%c%g", a->e[i].name, a->e[i].kind,
              strchr("bit", a->e[i].kind) ? (double)a->e[i].i : strchr("f", a->e[i].kind) ? a->e[i].f : a->e[i].count);
    logf_(" stream %d\n", sid);
    const struct emu_tdesc *const *d = (const struct emu_tdesc *const *)idesc;
    const struct emu_buffer *const *b = (const struct emu_buffer *const *)ibuf;
    const struct emu_tdesc *od = nout ? odesc[0] : NULL;
    float *y = nout ? ((struct emu_buffer *)obuf[0])->data : NULL;
    if (!strcmp(op, "Add") && nin == 2 && nout == 1) {
        int64_t n = numel(od->dims, od->ndim), n0 = numel(d[0]->dims, d[0]->ndim), n1 = numel(d[1]->dims, d[1]->ndim);
        if ((n0 != n && n0 != 1) || (n1 != n && n1 != 1))
            return fail(100021, "EZ9999: Add: the inputs do not broadcast to the output");
        const float *x0 = b[0]->data, *x1 = b[1]->data;
        for (int64_t k = 0; k < n; k++)
            y[k] = x0[n0 == 1 ? 0 : k] + x1[n1 == 1 ? 0 : k];
        return 0;
    }
    if (!strcmp(op, "MatMul") && nin >= 2 && nout == 1 && d[0]->ndim == 2 && d[1]->ndim == 2 && od->ndim == 2) {
        const struct emu_attr_entry *t1 = attr_get(a, "transpose_x1"), *t2 = attr_get(a, "transpose_x2");
        int ta = t1 && t1->i, tb = t2 && t2->i;
        int64_t m = d[0]->dims[ta ? 1 : 0], k = d[0]->dims[ta ? 0 : 1];
        int64_t k2 = d[1]->dims[tb ? 1 : 0], n = d[1]->dims[tb ? 0 : 1];
        if (k != k2 || od->dims[0] != m || od->dims[1] != n)
            return fail(100021, "EZ9999: MatMul: the shapes do not multiply");
        const float *x0 = b[0]->data, *x1 = b[1]->data;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                float s = 0;
                for (int64_t q = 0; q < k; q++)
                    s += x0[ta ? q * m + i : i * k + q] * x1[tb ? j * k + q : q * n + j];
                y[i * n + j] = s;
            }
        return 0;
    }
    snprintf(err, sizeof err, "EZ3003: No supported Ops kernel and engine are found for [%s], optype [%s].", op, op);
    return 100024;
}

EXPORT int aclopCompileAndExecute(const char *opType, int numInputs, const void *const inputDesc[],
                                  const void *const inputs[], int numOutputs, const void *const outputDesc[],
                                  void *const outputs[], const void *attr, int engineType, int compileFlag,
                                  const char *opPath, void *stream);
EXPORT int aclopCompileAndExecute(const char *opType, int numInputs, const void *const inputDesc[],
                                  const void *const inputs[], int numOutputs, const void *const outputDesc[],
                                  void *const outputs[], const void *attr, int engineType, int compileFlag,
                                  const char *opPath, void *stream)
{
    if (engineType != 0 || compileFlag != 0 || opPath)
        return fail(100000, "the emulator compiles with ACL_ENGINE_SYS, ACL_COMPILE_SYS and no opPath");
    return op_exec("aclopCompileAndExecute", opType, numInputs, inputDesc, inputs, numOutputs, outputDesc, outputs,
                   attr, stream);
}

EXPORT int aclopExecuteV2(const char *opType, int numInputs, void *inputDesc[], void *inputs[], int numOutputs,
                          void *outputDesc[], void *outputs[], void *attr, void *stream);
EXPORT int aclopExecuteV2(const char *opType, int numInputs, void *inputDesc[], void *inputs[], int numOutputs,
                          void *outputDesc[], void *outputs[], void *attr, void *stream)
{
    return op_exec("aclopExecuteV2", opType, numInputs, (const void *const *)inputDesc, (const void *const *)inputs,
                   numOutputs, (const void *const *)outputDesc, outputs, attr, stream);
}

/* -- aclnn ------------------------------------------------------------------------------------------- */

struct emu_tensor_nn {
    unsigned magic;
    int dtype, format;
    uint64_t ndim, sndim;
    int64_t dims[MAX_DIMS], strides[MAX_DIMS], sdims[MAX_DIMS], offset;
    float *data;
};
struct emu_scalar {
    unsigned magic;
    int dtype;
    double value;
};
struct emu_intarray {
    unsigned magic;
    uint64_t n;
    int64_t v[MAX_DIMS];
};
#define MAX_LIST 4
struct emu_executor {
    unsigned magic;
    char name[32];
    struct emu_tensor_nn a, b, out, list[MAX_LIST];
    uint64_t n_list;
    double other, alpha;
    uint64_t workspace;
};

EXPORT void *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum, int dataType, const int64_t *stride,
                             int64_t offset, int format, const int64_t *storageDims, uint64_t storageDimsNum,
                             void *tensorData);
EXPORT void *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum, int dataType, const int64_t *stride,
                             int64_t offset, int format, const int64_t *storageDims, uint64_t storageDimsNum,
                             void *tensorData)
{
    (void)enter("aclCreateTensor");
    if (viewDimsNum > MAX_DIMS || storageDimsNum > MAX_DIMS || (viewDimsNum && (!viewDims || !stride)))
        return NULL;
    struct emu_tensor_nn *t = calloc(1, sizeof *t);
    t->magic = EMU_MAGIC;
    t->dtype = dataType;
    t->format = format;
    t->ndim = viewDimsNum;
    t->sndim = storageDimsNum;
    t->offset = offset;
    t->data = tensorData;
    for (uint64_t k = 0; k < viewDimsNum; k++)
        t->dims[k] = viewDims[k], t->strides[k] = stride[k];
    for (uint64_t k = 0; k < storageDimsNum; k++)
        t->sdims[k] = storageDims[k];
    return t;
}

EXPORT int aclDestroyTensor(const void *t);
EXPORT int aclDestroyTensor(const void *t)
{
    (void)enter("aclDestroyTensor");
    free((void *)(uintptr_t)t);
    return 0;
}

EXPORT void *aclCreateScalar(void *value, int dataType);
EXPORT void *aclCreateScalar(void *value, int dataType)
{
    (void)enter("aclCreateScalar");
    if (!value)
        return NULL;
    struct emu_scalar *s = calloc(1, sizeof *s);
    s->magic = EMU_MAGIC;
    s->dtype = dataType;
    switch (dataType) {
    case 0: s->value = *(const float *)value; break;      /* ACL_FLOAT */
    case 11: s->value = *(const double *)value; break;    /* ACL_DOUBLE */
    case 9: s->value = (double)*(const int64_t *)value; break; /* ACL_INT64 */
    case 12: s->value = *(const uint8_t *)value != 0; break;  /* ACL_BOOL */
    default: free(s); return NULL;
    }
    return s;
}

EXPORT int aclDestroyScalar(const void *s);
EXPORT int aclDestroyScalar(const void *s)
{
    (void)enter("aclDestroyScalar");
    free((void *)(uintptr_t)s);
    return 0;
}

EXPORT void *aclCreateIntArray(const int64_t *value, uint64_t size);
EXPORT void *aclCreateIntArray(const int64_t *value, uint64_t size)
{
    (void)enter("aclCreateIntArray");
    if (size > MAX_DIMS || (size && !value))
        return NULL;
    struct emu_intarray *a = calloc(1, sizeof *a);
    a->magic = EMU_MAGIC;
    a->n = size;
    for (uint64_t k = 0; k < size; k++)
        a->v[k] = value[k];
    return a;
}

EXPORT int aclDestroyIntArray(const void *a);
EXPORT int aclDestroyIntArray(const void *a)
{
    (void)enter("aclDestroyIntArray");
    free((void *)(uintptr_t)a);
    return 0;
}

struct emu_tensorlist {
    unsigned magic;
    uint64_t n;
    const void *v[MAX_DIMS];
};

EXPORT void *aclCreateTensorList(const void *const *value, uint64_t size);
EXPORT void *aclCreateTensorList(const void *const *value, uint64_t size)
{
    if (size > MAX_DIMS || (size && !value))
        return NULL;
    struct emu_tensorlist *l = calloc(1, sizeof *l);
    l->magic = EMU_MAGIC;
    l->n = size;
    for (uint64_t k = 0; k < size; k++)
        l->v[k] = value[k];
    return l;
}

EXPORT int aclDestroyTensorList(const void *l);
EXPORT int aclDestroyTensorList(const void *l)
{
    free((void *)(uintptr_t)l);
    return 0;
}

/* element k (row-major over the view's dims) of a strided view */
static float *at(const struct emu_tensor_nn *t, int64_t k)
{
    int64_t off = t->offset;
    for (int d = (int)t->ndim - 1; d >= 0; d--) {
        off += (k % t->dims[d]) * t->strides[d];
        k /= t->dims[d];
    }
    return t->data + off;
}

static int nn_tensor(const char *fn, const char *param, const void *p, struct emu_tensor_nn *copy)
{
    const struct emu_tensor_nn *t = p;
    if (!t || t->magic != EMU_MAGIC) {
        snprintf(err, sizeof err, "EZ1001: %s: %s is not an aclTensor", fn, param);
        return 161001; /* ACLNN_ERR_PARAM_NULLPTR */
    }
    if (t->dtype != 0) {
        snprintf(err, sizeof err, "EZ1001: %s: %s has dtype %d, the emulator computes float32", fn, param, t->dtype);
        return 161002;
    }
    *copy = *t;
    logf_(" %s=d%d[", param, t->dtype);
    for (uint64_t k = 0; k < t->ndim; k++)
        logf_("%s%lld", k ? "," : "", (long long)t->dims[k]);
    logf_("]s[");
    for (uint64_t k = 0; k < t->ndim; k++)
        logf_("%s%lld", k ? "," : "", (long long)t->strides[k]);
    logf_("]o%lld", (long long)t->offset);
    return 0;
}

static int nn_scalar(const char *param, const void *p, double *v)
{
    const struct emu_scalar *s = p;
    if (!s || s->magic != EMU_MAGIC)
        return 161001;
    *v = s->value;
    logf_(" %s=t%d:%g", param, s->dtype, s->value);
    return 0;
}

static int64_t nn_numel(const struct emu_tensor_nn *t)
{
    return numel(t->dims, (int)t->ndim);
}

static int nn_finish(struct emu_executor *e, uint64_t *ws, void **executor)
{
    logf_(" ws %llu\n", (unsigned long long)e->workspace);
    *ws = e->workspace;
    *executor = e;
    return 0;
}

EXPORT int aclnnAddsGetWorkspaceSize(const void *self, const void *other, const void *alpha, void *out,
                                     uint64_t *workspaceSize, void **executor);
EXPORT int aclnnAddsGetWorkspaceSize(const void *self, const void *other, const void *alpha, void *out,
                                     uint64_t *workspaceSize, void **executor)
{
    int code = enter("aclnnAddsGetWorkspaceSize");
    if (code)
        return code;
    struct emu_executor *e = calloc(1, sizeof *e);
    *e = (struct emu_executor){.magic = EMU_MAGIC, .name = "aclnnAdds", .workspace = ADDS_WORKSPACE};
    logf_("aclnnAddsGetWorkspaceSize");
    if ((code = nn_tensor("aclnnAdds", "self", self, &e->a)) || (code = nn_scalar("other", other, &e->other)) ||
        (code = nn_scalar("alpha", alpha, &e->alpha)) || (code = nn_tensor("aclnnAdds", "out", out, &e->out))) {
        logf_(" refused %d\n", code);
        free(e);
        return code;
    }
    if (nn_numel(&e->a) != nn_numel(&e->out)) {
        free(e);
        snprintf(err, sizeof err, "EZ1001: aclnnAdds: self and out differ in shape");
        return 161002;
    }
    return nn_finish(e, workspaceSize, executor);
}

EXPORT int aclnnMatmulGetWorkspaceSize(const void *self, const void *mat2, void *out, int8_t cubeMathType,
                                       uint64_t *workspaceSize, void **executor);
EXPORT int aclnnMatmulGetWorkspaceSize(const void *self, const void *mat2, void *out, int8_t cubeMathType,
                                       uint64_t *workspaceSize, void **executor)
{
    int code = enter("aclnnMatmulGetWorkspaceSize");
    if (code)
        return code;
    struct emu_executor *e = calloc(1, sizeof *e);
    *e = (struct emu_executor){.magic = EMU_MAGIC, .name = "aclnnMatmul"};
    logf_("aclnnMatmulGetWorkspaceSize");
    if ((code = nn_tensor("aclnnMatmul", "self", self, &e->a)) ||
        (code = nn_tensor("aclnnMatmul", "mat2", mat2, &e->b)) ||
        (code = nn_tensor("aclnnMatmul", "out", out, &e->out))) {
        logf_(" refused %d\n", code);
        free(e);
        return code;
    }
    logf_(" cubeMathType=%d", (int)cubeMathType);
    if (e->a.ndim != 2 || e->b.ndim != 2 || e->out.ndim != 2 || e->a.dims[1] != e->b.dims[0] ||
        e->out.dims[0] != e->a.dims[0] || e->out.dims[1] != e->b.dims[1]) {
        logf_(" refused 161002\n");
        snprintf(err, sizeof err, "EZ1001: aclnnMatmul: the shapes [%lld, %lld] and [%lld, %lld] cannot be multiplied",
                 (long long)e->a.dims[0], (long long)e->a.dims[1], (long long)e->b.dims[0], (long long)e->b.dims[1]);
        free(e);
        return 161002;
    }
    return nn_finish(e, workspaceSize, executor);
}

EXPORT int aclnnCatGetWorkspaceSize(const void *tensors, int64_t dim, void *out, uint64_t *workspaceSize,
                                    void **executor);
EXPORT int aclnnCatGetWorkspaceSize(const void *tensors, int64_t dim, void *out, uint64_t *workspaceSize,
                                    void **executor)
{
    const struct emu_tensorlist *l = tensors;
    if (!l || l->magic != EMU_MAGIC || l->n > MAX_LIST || dim != 0) {
        snprintf(err, sizeof err, "EZ1001: aclnnCat: a list of at most %d tensors, dim 0", MAX_LIST);
        return 161002;
    }
    struct emu_executor *e = calloc(1, sizeof *e);
    *e = (struct emu_executor){.magic = EMU_MAGIC, .name = "aclnnCat", .n_list = l->n};
    logf_("aclnnCatGetWorkspaceSize tensors %llu", (unsigned long long)l->n);
    int code = 0;
    int64_t rows = 0;
    for (uint64_t k = 0; k < l->n && !code; k++) {
        code = nn_tensor("aclnnCat", "tensors", l->v[k], &e->list[k]);
        rows += e->list[k].ndim == 2 ? e->list[k].dims[0] : 0;
    }
    if (!code)
        code = nn_tensor("aclnnCat", "out", out, &e->out);
    if (!code && (e->out.ndim != 2 || rows != e->out.dims[0])) {
        snprintf(err, sizeof err, "EZ1001: aclnnCat: the rows do not add up to out's");
        code = 161002;
    }
    logf_(" dim %lld", (long long)dim);
    if (code) {
        logf_(" refused %d\n", code);
        free(e);
        return code;
    }
    return nn_finish(e, workspaceSize, executor);
}

static int nn_launch(const char *fn, void *workspace, uint64_t size, void *executor, void *stream,
                     struct emu_executor **e)
{
    int code = enter(fn);
    if (code)
        return code;
    *e = executor;
    if (!*e || (*e)->magic != EMU_MAGIC || strcmp((*e)->name, fn) != 0) {
        snprintf(err, sizeof err, "EZ1001: %s: the executor is not one %sGetWorkspaceSize made", fn, fn);
        return 161002;
    }
    int sid = stream_id(stream);
    pthread_mutex_lock(&mu);
    int ws_ok = !(*e)->workspace || (size >= (*e)->workspace && find(workspace, (*e)->workspace));
    pthread_mutex_unlock(&mu);
    logf_("%s ws %llu%s stream %d\n", fn, (unsigned long long)size, ws_ok && workspace ? " dev" : "", sid);
    if (sid < 0 || !ws_ok) {
        free(*e);
        snprintf(err, sizeof err, "EZ1001: %s: %s", fn, sid < 0 ? "invalid stream" : "the workspace is not device memory");
        return 161002;
    }
    return 0;
}

EXPORT int aclnnAdds(void *workspace, uint64_t workspaceSize, void *executor, void *stream);
EXPORT int aclnnAdds(void *workspace, uint64_t workspaceSize, void *executor, void *stream)
{
    struct emu_executor *e;
    int code = nn_launch("aclnnAdds", workspace, workspaceSize, executor, stream, &e);
    if (code)
        return code;
    for (int64_t k = 0; k < nn_numel(&e->out); k++)
        *at(&e->out, k) = *at(&e->a, k) + (float)(e->other * e->alpha);
    free(e);
    return 0;
}

EXPORT int aclnnCat(void *workspace, uint64_t workspaceSize, void *executor, void *stream);
EXPORT int aclnnCat(void *workspace, uint64_t workspaceSize, void *executor, void *stream)
{
    struct emu_executor *e;
    int code = nn_launch("aclnnCat", workspace, workspaceSize, executor, stream, &e);
    if (code)
        return code;
    int64_t at_out = 0;
    for (uint64_t k = 0; k < e->n_list; k++)
        for (int64_t i = 0; i < nn_numel(&e->list[k]); i++)
            *at(&e->out, at_out++) = *at(&e->list[k], i);
    free(e);
    return 0;
}

EXPORT int aclnnMatmul(void *workspace, uint64_t workspaceSize, void *executor, void *stream);
EXPORT int aclnnMatmul(void *workspace, uint64_t workspaceSize, void *executor, void *stream)
{
    struct emu_executor *e;
    int code = nn_launch("aclnnMatmul", workspace, workspaceSize, executor, stream, &e);
    if (code)
        return code;
    int64_t m = e->a.dims[0], k = e->a.dims[1], n = e->b.dims[1];
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float s = 0;
            for (int64_t q = 0; q < k; q++)
                s += *at(&e->a, i * k + q) * *at(&e->b, q * n + j);
            *at(&e->out, i * n + j) = s;
        }
    free(e);
    return 0;
}

/* -- virtual memory ---------------------------------------------------------------------------------- */

struct emu_prop { /* aclrtPhysicalMemProp */
    int handleType, allocationType, memAttr;
    struct {
        uint32_t id;
        int type;
    } location;
    uint64_t reserve;
};
static struct {
    uintptr_t va;
    size_t size;
    void *handle;
} maps[MAX_MAPS];

static int mapped(const struct alloc *range, uintptr_t a, size_t count)
{
    (void)range;
    uintptr_t end = a + count;
    while (a < end) {
        int i = 0;
        while (i < MAX_MAPS && !(maps[i].size && maps[i].va <= a && a < maps[i].va + maps[i].size))
            i++;
        if (i == MAX_MAPS)
            return 0;
        a = maps[i].va + maps[i].size;
    }
    return 1;
}

static struct alloc *slot_of(const void *p, int kind)
{
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].p && allocs[i].p == p && allocs[i].kind == kind)
            return &allocs[i];
    return NULL;
}

static int vmm_add(void **out, size_t size, int kind)
{
    int i = 0;
    while (i < MAX_ALLOCS && allocs[i].p)
        i++;
    unsigned char *m = i < MAX_ALLOCS ? calloc(1, kind == RESERVED ? size : 1) : NULL;
    if (!m)
        return fail(207001, "EL0004: emulator table full");
    allocs[i] = (struct alloc){m, size, current, kind};
    *out = m;
    return 0;
}

EXPORT int aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment, void *expectPtr, uint64_t flags);
EXPORT int aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment, void *expectPtr, uint64_t flags)
{
    (void)alignment, (void)expectPtr;
    int code = enter("aclrtReserveMemAddress");
    if (code)
        return code;
    if (!virPtr || !size || flags > 1 || current < 0)
        return fail(107000, "aclrtReserveMemAddress: bad argument or no device");
    pthread_mutex_lock(&mu);
    int rc = vmm_add(virPtr, size, RESERVED);
    if (!rc)
        logf_("aclrtReserveMemAddress %zu\n", size);
    pthread_mutex_unlock(&mu);
    return rc;
}

EXPORT int aclrtMallocPhysical(void **handle, size_t size, const struct emu_prop *prop, uint64_t flags);
EXPORT int aclrtMallocPhysical(void **handle, size_t size, const struct emu_prop *prop, uint64_t flags)
{
    int code = enter("aclrtMallocPhysical");
    if (code)
        return code;
    if (!handle || !size || !prop || flags || prop->location.type != 1 || (int)prop->location.id != current)
        return fail(107000, "aclrtMallocPhysical: bad argument (the location must be the current device)");
    pthread_mutex_lock(&mu);
    int rc = used(current) + size > memory() ? fail(207001, "EL0004: device out of memory")
                                             : vmm_add(handle, size, PHYSICAL);
    if (!rc)
        logf_("aclrtMallocPhysical %zu device %u memAttr %d\n", size, prop->location.id, prop->memAttr);
    pthread_mutex_unlock(&mu);
    return rc;
}

EXPORT int aclrtMapMem(void *virPtr, size_t size, size_t offset, void *handle, uint64_t flags);
EXPORT int aclrtMapMem(void *virPtr, size_t size, size_t offset, void *handle, uint64_t flags)
{
    int code = enter("aclrtMapMem");
    if (code)
        return code;
    pthread_mutex_lock(&mu);
    struct alloc *h = slot_of(handle, PHYSICAL);
    uintptr_t a = (uintptr_t)virPtr;
    int inside = 0, free_slot = -1, overlap = 0;
    for (int i = 0; i < MAX_ALLOCS; i++)
        inside |= allocs[i].p && allocs[i].kind == RESERVED && a >= (uintptr_t)allocs[i].p &&
                  a + size <= (uintptr_t)allocs[i].p + allocs[i].size;
    for (int i = 0; i < MAX_MAPS; i++) {
        if (!maps[i].size && free_slot < 0)
            free_slot = i;
        overlap |= maps[i].size && maps[i].va < a + size && a < maps[i].va + maps[i].size;
    }
    int rc = 0;
    if (!h || !inside || overlap || !size || flags || offset + size > h->size || free_slot < 0)
        rc = fail(107000, "aclrtMapMem: not a handle, outside a reserved range, overlapping, or past the handle");
    else
        maps[free_slot].va = a, maps[free_slot].size = size, maps[free_slot].handle = handle;
    if (!rc)
        logf_("aclrtMapMem %zu offset %zu\n", size, offset);
    pthread_mutex_unlock(&mu);
    return rc;
}

EXPORT int aclrtUnmapMem(void *virPtr);
EXPORT int aclrtUnmapMem(void *virPtr)
{
    int code = enter("aclrtUnmapMem");
    if (code)
        return code;
    pthread_mutex_lock(&mu);
    int rc = fail(107000, "aclrtUnmapMem: no mapping starts there");
    for (int i = 0; i < MAX_MAPS; i++)
        if (maps[i].size && maps[i].va == (uintptr_t)virPtr) {
            logf_("aclrtUnmapMem %zu\n", maps[i].size);
            maps[i].size = 0;
            rc = 0;
            err[0] = '\0';
        }
    pthread_mutex_unlock(&mu);
    return rc;
}

/* free a reserved range or a handle that no mapping uses */
static int vmm_free(const char *fn, void *p, int kind)
{
    int code = enter(fn);
    if (code)
        return code;
    pthread_mutex_lock(&mu);
    struct alloc *s = slot_of(p, kind);
    int busy = 0;
    for (int i = 0; s && i < MAX_MAPS; i++)
        busy |= maps[i].size &&
                (kind == PHYSICAL ? maps[i].handle == p
                                  : maps[i].va >= (uintptr_t)s->p && maps[i].va < (uintptr_t)s->p + s->size);
    int rc = 0;
    if (!s || busy) {
        snprintf(err, sizeof err, "%s: %s", fn, s ? "still mapped" : "unknown pointer");
        rc = 107000;
    } else {
        logf_("%s %zu\n", fn, s->size);
        free(s->p);
        s->p = NULL;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

EXPORT int aclrtReleaseMemAddress(void *virPtr);
EXPORT int aclrtReleaseMemAddress(void *virPtr)
{
    return vmm_free("aclrtReleaseMemAddress", virPtr, RESERVED);
}

EXPORT int aclrtFreePhysical(void *handle);
EXPORT int aclrtFreePhysical(void *handle)
{
    return vmm_free("aclrtFreePhysical", handle, PHYSICAL);
}

/* -- kernel binaries ----------------------------------------------------------------------------------
 * A binary is "EMUKBIN\n" then its kernels' names, one a line. One kernel computes: fill_u32, whose
 * arguments are {uint64_t ptr; uint32_t count; uint32_t value}: count words of value at ptr (device memory). */

struct emu_binary {
    unsigned magic;
    size_t size;
    char *text;
};
struct emu_function {
    unsigned magic;
    struct emu_binary *bin;
    char name[64];
};

EXPORT int aclrtBinaryLoadFromData(const void *data, size_t length, const void *options, void **binHandle);
EXPORT int aclrtBinaryLoadFromData(const void *data, size_t length, const void *options, void **binHandle)
{
    (void)options;
    if (!data || !binHandle || length < 8 || memcmp(data, "EMUKBIN\n", 8) != 0)
        return fail(107000, "aclrtBinaryLoadFromData: not a kernel binary");
    struct emu_binary *b = calloc(1, sizeof *b);
    b->magic = EMU_MAGIC;
    b->size = length;
    b->text = calloc(1, length + 1);
    memcpy(b->text, data, length);
    *binHandle = b;
    logf_("aclrtBinaryLoadFromData %zu\n", length);
    return 0;
}

EXPORT int aclrtBinaryGetFunction(const void *binHandle, const char *kernelName, void **funcHandle);
EXPORT int aclrtBinaryGetFunction(const void *binHandle, const char *kernelName, void **funcHandle)
{
    const struct emu_binary *b = binHandle;
    if (!b || b->magic != EMU_MAGIC || !kernelName || !funcHandle || strlen(kernelName) >= 64)
        return fail(107000, "aclrtBinaryGetFunction: bad argument");
    char line[80];
    snprintf(line, sizeof line, "\n%s\n", kernelName);
    if (!strstr(b->text + 7, line)) {
        snprintf(err, sizeof err, "EE1001: aclrtBinaryGetFunction: kernel %s is not in the binary", kernelName);
        return 107000;
    }
    struct emu_function *f = calloc(1, sizeof *f);
    f->magic = EMU_MAGIC;
    f->bin = (struct emu_binary *)(uintptr_t)b;
    snprintf(f->name, sizeof f->name, "%s", kernelName);
    *funcHandle = f;
    logf_("aclrtBinaryGetFunction %s\n", kernelName);
    return 0;
}

EXPORT int aclrtLaunchKernel(void *funcHandle, uint32_t numBlocks, const void *argsData, size_t argsSize,
                             void *stream);
EXPORT int aclrtLaunchKernel(void *funcHandle, uint32_t numBlocks, const void *argsData, size_t argsSize,
                             void *stream)
{
    const struct emu_function *f = funcHandle;
    int sid = stream_id(stream);
    if (!f || f->magic != EMU_MAGIC || sid < 0)
        return fail(107000, "aclrtLaunchKernel: not a function handle, or an invalid stream");
    logf_("aclrtLaunchKernel %s blocks %u args %zu stream %d\n", f->name, numBlocks, argsSize, sid);
    if (!strcmp(f->name, "fill_u32")) {
        struct {
            uint64_t ptr;
            uint32_t count, value;
        } a;
        if (argsSize != sizeof a || !argsData)
            return fail(507015, "EZ9999: fill_u32: the arguments are {ptr, count, value}");
        memcpy(&a, argsData, sizeof a);
        pthread_mutex_lock(&mu);
        int ok = find((void *)(uintptr_t)a.ptr, (size_t)a.count * 4) != NULL;
        pthread_mutex_unlock(&mu);
        if (!ok)
            return fail(507015, "EZ9999: fill_u32: ptr is not device memory (an AI Core exception)");
        uint32_t *w = (uint32_t *)(uintptr_t)a.ptr;
        for (uint32_t i = 0; i < a.count; i++)
            w[i] = a.value;
    }
    return 0;
}

EXPORT int aclrtBinaryUnLoad(void *binHandle);
EXPORT int aclrtBinaryUnLoad(void *binHandle)
{
    struct emu_binary *b = binHandle;
    if (!b || b->magic != EMU_MAGIC)
        return fail(107000, "aclrtBinaryUnLoad: not a binary");
    logf_("aclrtBinaryUnLoad %zu\n", b->size);
    b->magic = 0;
    free(b->text);
    free(b);
    return 0;
}
