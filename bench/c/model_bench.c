/* model_bench.c: times aclmdlExecute of one model through libascendcl, for bench/bench_models.py and
 * bench/bench_latency.py. Usage: model_bench <model>; then each line on stdin is one block:
 *   "N"       N executions back to back (closed loop), one line "exec <ns>" each;
 *   "N I"     N executions open loop, one every I microseconds (CLOCK_MONOTONIC schedule; a late one
 *             starts at once), one line "exec <ns> <late ns>" each;
 *   "t MS"    executions back to back for MS milliseconds, then one line "count <n>";
 * then "done". EOF ends it. The model's input 0 and output 0 take buffers of their sizes. */
#include <acl/acl.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static aclmdlDataset *dataset(aclmdlDesc *desc, int outputs)
{
    aclmdlDataset *ds = aclmdlCreateDataset();
    size_t n = outputs ? aclmdlGetNumOutputs(desc) : aclmdlGetNumInputs(desc);
    for (size_t i = 0; i < n; i++) {
        size_t size = outputs ? aclmdlGetOutputSizeByIndex(desc, i) : aclmdlGetInputSizeByIndex(desc, i);
        void *dev = NULL;
        if (aclrtMalloc(&dev, size, ACL_MEM_MALLOC_HUGE_FIRST) != ACL_SUCCESS)
            return NULL;
        aclmdlAddDatasetBuffer(ds, aclCreateDataBuffer(dev, size));
    }
    return ds;
}

int main(int argc, char **argv)
{
    uint32_t id;
    if (argc != 2 || aclInit(NULL) || aclrtSetDevice(0) || aclmdlLoadFromFile(argv[1], &id)) {
        fprintf(stderr, "model_bench: setup failed: %s\n", aclGetRecentErrMsg() ? aclGetRecentErrMsg() : "usage");
        return 1;
    }
    aclmdlDesc *desc = aclmdlCreateDesc();
    aclmdlGetDesc(desc, id);
    aclmdlDataset *in = dataset(desc, 0), *out = dataset(desc, 1);
    if (!in || !out)
        return 1;
    printf("ready\n");
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        long long n = 0, arg = 0;
        if (line[0] == 't') {
            long long end = now_ns() + atoll(line + 1) * 1000000LL, count = 0;
            while (now_ns() < end) {
                if (aclmdlExecute(id, in, out) != ACL_SUCCESS) {
                    fprintf(stderr, "model_bench: %s\n", aclGetRecentErrMsg());
                    return 1;
                }
                count++;
            }
            printf("count %lld\n", count);
        } else {
            int fields = sscanf(line, "%lld %lld", &n, &arg);
            long long next = now_ns();
            for (long long i = 0; i < n; i++) {
                long long late = 0;
                if (fields == 2) {
                    struct timespec at = {next / 1000000000LL, next % 1000000000LL};
                    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL);
                    late = now_ns() - next;
                    next += arg * 1000LL;
                }
                long long t0 = now_ns();
                if (aclmdlExecute(id, in, out) != ACL_SUCCESS) {
                    fprintf(stderr, "model_bench: %s\n", aclGetRecentErrMsg());
                    return 1;
                }
                if (fields == 2)
                    printf("exec %lld %lld\n", now_ns() - t0, late);
                else
                    printf("exec %lld\n", now_ns() - t0);
            }
        }
        printf("done\n");
        fflush(stdout);
    }
    aclmdlUnload(id);
    aclFinalize();
    return 0;
}
