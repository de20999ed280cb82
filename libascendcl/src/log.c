/*
 * log.c: aclAppLog, host-side: an application's log line on stderr, in CANN's layout
 *
 *     [ERROR] APP(<pid>,<comm>):2026-01-02-03:04:05.678.901 [<file>:<line>]<tid> <func>: <message>
 *
 * Lines below ASCEND_GLOBAL_LOG_LEVEL (0 debug, 1 info, 2 warning, 3 error, 4 none; default 3, as
 * CANN) are dropped, as is an unknown level. The formatted message is cut at 1024 bytes with a
 * "...[truncated]" mark, as CANN's header documents. One write(2) per line, so lines of threads and
 * processes sharing stderr do not interleave.
 */
#include "client.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define LOG_MESSAGE_MAX 1024
#define LOG_LEVEL_NONE 4
#define TRUNCATED "...[truncated]"

static int threshold(void)
{
    const char *v = getenv("ASCEND_GLOBAL_LOG_LEVEL");
    if (v && v[0] >= '0' && v[0] <= '4' && v[1] == '\0')
        return v[0] - '0';
    return ACL_ERROR;
}

static const char *level_name(int level)
{
    static const char *const names[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
    return names[level];
}

static const char *process_name(char *buf, size_t size)
{
    FILE *f = fopen("/proc/self/comm", "re");
    size_t n = f ? fread(buf, 1, size - 1, f) : 0;
    if (f)
        fclose(f);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\0'))
        n--;
    buf[n] = '\0';
    return n ? buf : "?";
}

API void aclAppLog(aclLogLevel logLevel, const char *func, const char *file, uint32_t line, const char *fmt, ...)
{
    int level = (int)logLevel;
    if (level < ACL_DEBUG || level > ACL_ERROR || level < threshold() || !fmt)
        return;
    char message[LOG_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    if (n < 0)
        snprintf(message, sizeof message, "(unformattable log message)");
    else if ((size_t)n >= sizeof message)
        memcpy(message + sizeof message - sizeof TRUNCATED, TRUNCATED, sizeof TRUNCATED);

    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    localtime_r(&tv.tv_sec, &tm);
    char comm[32], out[LOG_MESSAGE_MAX + 512];
    const char *base = file ? strrchr(file, '/') : NULL;
    int len = snprintf(out, sizeof out, "[%s] APP(%d,%s):%04d-%02d-%02d-%02d:%02d:%02d.%03ld.%03ld [%s:%u]%ld %s: %s\n",
                       level_name(level), (int)getpid(), process_name(comm, sizeof comm), tm.tm_year + 1900,
                       tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (long)tv.tv_usec / 1000,
                       (long)tv.tv_usec % 1000, base ? base + 1 : file ? file : "?", line, (long)syscall(SYS_gettid),
                       func ? func : "?", message);
    if (len < 0)
        return;
    size_t size = (size_t)len < sizeof out ? (size_t)len : sizeof out - 1;
    for (size_t done = 0; done < size;) {
        ssize_t w = write(STDERR_FILENO, out + done, size - done);
        if (w <= 0)
            break;
        done += (size_t)w;
    }
}
