/* conf_driver.c: feeds client.conf texts to libascendcl's reader (src/conf.c, compiled in) for
 * tests/c/test_conf_parser.py. Input file: cases separated by a 0xFF byte (never valid in
 * UTF-8 JSON). Prints one line per case: its ACL code. Built with sanitizers by the test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    FILE *f = fopen(argv[1], "rb");
    if (!f)
        return 2;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *all = malloc((size_t)n + 1);
    if (!all || fread(all, 1, (size_t)n, f) != (size_t)n)
        return 2;
    fclose(f);
    long start = 0;
    for (long i = 0; i <= n; i++) {
        if (i < n && (unsigned char)all[i] != 0xFF)
            continue;
        size_t len = (size_t)(i - start);
        char *copy = malloc(len ? len : 1); /* exact size: an overread is a sanitizer error */
        memcpy(copy, all + start, len);
        struct client_conf conf;
        char err[1024];
        int rc = conf_parse(copy, len, "case", &conf, err, sizeof err);
        printf("%d %s\n", rc, rc ? err : conf.claim_uid);
        free(copy);
        start = i + 1;
    }
    free(all);
    return 0;
}
