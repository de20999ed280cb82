/* echo.c: the raw baseline of bench_c_client.py. Listens on a unix socket, accepts one client
 * and answers every request of REQ bytes with REP bytes until the client closes.
 * Usage: echo <socket path> <request bytes> <reply bytes>; prints "ready" once listening. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 4)
        return 2;
    size_t req = strtoul(argv[2], NULL, 10), rep = strtoul(argv[3], NULL, 10);
    int srv = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", argv[1]);
    if (bind(srv, (struct sockaddr *)&sa, sizeof sa) || listen(srv, 1))
        return 1;
    printf("ready\n");
    fflush(stdout);
    int c = accept(srv, NULL, NULL);
    char buf[65536], out[4096];
    memset(out, 'x', sizeof out);
    for (;;) {
        size_t got = 0;
        while (got < req) {
            ssize_t n = recv(c, buf, sizeof buf, 0);
            if (n <= 0)
                return 0;
            got += (size_t)n;
        }
        if (send(c, out, rep, MSG_NOSIGNAL) != (ssize_t)rep)
            return 0;
    }
}
