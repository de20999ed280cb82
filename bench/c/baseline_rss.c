/* baseline_rss.c: VmRSS of a C program that does not load libascendcl.so (bench_c_client.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            printf("rss baseline %ld\n", strtol(line + 6, NULL, 10));
    return 0;
}
