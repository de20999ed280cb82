/*
 * acl_bench.c: measurements of libascendcl.so for bench/bench_c_client.py. Prints one sample per
 * line, "<kind> <nanoseconds>", or "rss <stage> <kB>".
 *   acl_bench roundtrip <echo socket> <rounds> <per round>
 *       aclrtGetMemInfo round trips and raw ping-pongs (request 21 B, reply 37 B, the sizes of a
 *       GET_MEM_INFO exchange) to the echo server, interleaved in blocks.
 *   acl_bench memcpy <bytes> <rounds>
 *       aclrtMemcpy host->device and device->host from aclrtMallocHost buffers, and an
 *       in-process memcpy between two pre-touched buffers of the same size, and the same copies
 *       from plain malloc buffers (staged through the staging region), interleaved.
 *   acl_bench rss     VmRSS before aclInit, after aclInit + aclrtSetDevice, after a malloc+copy.
 *   acl_bench calls <seconds>   aclrtGetMemInfo calls completed in that time (throughput).
 */
#include <acl/acl.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void must(int rc, const char *what)
{
    if (rc) {
        const char *m = aclGetRecentErrMsg();
        fprintf(stderr, "%s failed: %d %s\n", what, rc, m ? m : "");
        exit(1);
    }
}

static long rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            kb = strtol(line + 6, NULL, 10);
    if (f)
        fclose(f);
    return kb;
}

static void roundtrip(const char *sock, int rounds, int per)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        perror("connect echo");
        exit(1);
    }
    must(aclInit(NULL), "aclInit");
    must(aclrtSetDevice(0), "aclrtSetDevice");
    char req[21], rep[64];
    memset(req, 'y', sizeof req);
    size_t f, t;
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < per; i++) {
            long long t0 = now_ns();
            must(aclrtGetMemInfo(ACL_HBM_MEM, &f, &t), "aclrtGetMemInfo");
            printf("acl %lld\n", now_ns() - t0);
        }
        for (int i = 0; i < per; i++) {
            long long t0 = now_ns();
            if (send(fd, req, sizeof req, 0) != (ssize_t)sizeof req)
                exit(1);
            size_t got = 0;
            while (got < 37) {
                ssize_t n = recv(fd, rep, sizeof rep, 0);
                if (n <= 0)
                    exit(1);
                got += (size_t)n;
            }
            printf("raw %lld\n", now_ns() - t0);
        }
    }
    close(fd);
    must(aclFinalize(), "aclFinalize");
}

static void copies(size_t n, int rounds)
{
    must(aclInit(NULL), "aclInit");
    must(aclrtSetDevice(0), "aclrtSetDevice");
    void *dev, *hs, *hd;
    must(aclrtMalloc(&dev, n, ACL_MEM_MALLOC_HUGE_FIRST), "aclrtMalloc");
    must(aclrtMallocHost(&hs, n), "aclrtMallocHost");
    must(aclrtMallocHost(&hd, n), "aclrtMallocHost");
    unsigned char *a = malloc(n), *b = malloc(n);
    memset(a, 1, n);
    memset(b, 2, n);
    memset(hs, 3, n);
    must(aclrtMemcpy(dev, n, hs, n, ACL_MEMCPY_HOST_TO_DEVICE), "warm-up");
    must(aclrtMemcpy(hd, n, dev, n, ACL_MEMCPY_DEVICE_TO_HOST), "warm-up");
    for (int r = 0; r < rounds; r++) {
        long long t0 = now_ns();
        must(aclrtMemcpy(dev, n, hs, n, ACL_MEMCPY_HOST_TO_DEVICE), "h2d");
        long long t1 = now_ns();
        must(aclrtMemcpy(hd, n, dev, n, ACL_MEMCPY_DEVICE_TO_HOST), "d2h");
        long long t2 = now_ns();
        memcpy(b, a, n);
        long long t3 = now_ns();
        must(aclrtMemcpy(dev, n, a, n, ACL_MEMCPY_HOST_TO_DEVICE), "h2d staged");
        long long t4 = now_ns();
        must(aclrtMemcpy(b, n, dev, n, ACL_MEMCPY_DEVICE_TO_HOST), "d2h staged");
        long long t5 = now_ns();
        printf("h2d %lld\nd2h %lld\nmemcpy %lld\nh2d-staged %lld\nd2h-staged %lld\n", t1 - t0, t2 - t1, t3 - t2,
               t4 - t3, t5 - t4);
        a[r % n] ^= b[(r * 7) % n]; /* keep the copy observable */
    }
    if (memcmp(hs, hd, n))
        exit(3);
    must(aclFinalize(), "aclFinalize");
}

static void rss(void)
{
    printf("rss loaded %ld\n", rss_kb());
    must(aclInit(NULL), "aclInit");
    must(aclrtSetDevice(0), "aclrtSetDevice");
    size_t f, t;
    must(aclrtGetMemInfo(ACL_HBM_MEM, &f, &t), "aclrtGetMemInfo");
    printf("rss initialized %ld\n", rss_kb());
    void *dev;
    char buf[65536] = {1};
    must(aclrtMalloc(&dev, sizeof buf, ACL_MEM_MALLOC_HUGE_FIRST), "aclrtMalloc");
    must(aclrtMemcpy(dev, sizeof buf, buf, sizeof buf, ACL_MEMCPY_HOST_TO_DEVICE), "aclrtMemcpy");
    printf("rss used %ld\n", rss_kb());
    must(aclFinalize(), "aclFinalize");
}

static void calls(double seconds)
{
    must(aclInit(NULL), "aclInit");
    must(aclrtSetDevice(0), "aclrtSetDevice");
    size_t f, t;
    printf("ready\n");
    fflush(stdout);
    char go;
    if (read(0, &go, 1) != 1)
        exit(1);
    long long end = now_ns() + (long long)(seconds * 1e9), n = 0;
    while (now_ns() < end) {
        must(aclrtGetMemInfo(ACL_HBM_MEM, &f, &t), "aclrtGetMemInfo");
        n++;
    }
    printf("calls %lld\n", n);
    must(aclFinalize(), "aclFinalize");
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "roundtrip"))
        roundtrip(argv[2], atoi(argv[3]), atoi(argv[4]));
    else if (argc == 4 && !strcmp(argv[1], "memcpy"))
        copies(strtoull(argv[2], NULL, 10), atoi(argv[3]));
    else if (argc == 2 && !strcmp(argv[1], "rss"))
        rss();
    else if (argc == 3 && !strcmp(argv[1], "calls"))
        calls(atof(argv[2]));
    else
        return 2;
    return 0;
}
