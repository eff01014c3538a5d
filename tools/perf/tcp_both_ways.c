/*
 * The floor of a 2-rank all-reduce's exchange over loopback TCP: two processes each send LEN
 * bytes to the other and receive the other's LEN bytes per exchange, non-blocking and
 * interleaved (as oxccl's engine does), with no reduction, over one connection (CONNS=1) or
 * two, one per direction (CONNS=2, as oxccl's TCP links have since 2026-12-05). Writes of at
 * most CHUNK bytes (default LEN). Prints the median time per exchange over 5 runs.
 *
 *   cc -O2 -o /tmp/tcp_both_ways tools/perf/tcp_both_ways.c && /tmp/tcp_both_ways LEN CONNS [CHUNK]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RUNS 5

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int dial(const struct sockaddr_in *a) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (const void *)a, sizeof *a)) { perror("connect"); exit(1); }
    return fd;
}

static void prepare(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, O_NONBLOCK);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s LEN CONNS [CHUNK]\n", argv[0]);
        return 2;
    }
    size_t len = (size_t)atol(argv[1]), chunk = argc > 3 ? (size_t)atol(argv[3]) : len;
    int conns = atoi(argv[2]);
    if (len == 0 || chunk == 0 || (conns != 1 && conns != 2)) { fprintf(stderr, "bad arguments\n"); return 2; }
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (bind(ls, (void *)&a, sizeof a) || listen(ls, 4) || getsockname(ls, (void *)&a, &al)) {
        perror("bind/listen");
        return 1;
    }
    char *out = malloc(len), *in = malloc(len);
    memset(out, 1, len);
    pid_t pid = fork();
    int tx, rx;
    if (pid == 0) {
        tx = dial(&a);
        rx = conns == 2 ? dial(&a) : tx;
    } else {
        rx = accept(ls, NULL, NULL);
        tx = conns == 2 ? accept(ls, NULL, NULL) : rx;
    }
    prepare(tx);
    prepare(rx);
    int iters = len >= (1 << 20) ? 2000 : 20000;
    double t[RUNS];
    for (int k = -1; k < RUNS; k++) { /* run -1 warms up */
        double start = now();
        for (int i = 0; i < iters; i++) {
            size_t sent = 0, got = 0;
            while (sent < len || got < len) {
                if (sent < len) {
                    size_t n = len - sent;
                    if (n > chunk - sent % chunk) n = chunk - sent % chunk;
                    ssize_t r = send(tx, out + sent, n, MSG_DONTWAIT);
                    if (r > 0) sent += (size_t)r;
                    else if (errno != EAGAIN && errno != EWOULDBLOCK) { perror("send"); exit(1); }
                }
                if (got < len) {
                    ssize_t r = recv(rx, in + got, len - got, MSG_DONTWAIT);
                    if (r > 0) got += (size_t)r;
                    else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) { perror("recv"); exit(1); }
                }
            }
        }
        if (k >= 0) t[k] = (now() - start) / iters * 1e6;
    }
    if (pid != 0) {
        qsort(t, RUNS, sizeof t[0], cmp);
        printf("exchange of %zu B both ways, %d connection(s), writes of %zu B: %.1f us (min %.1f, "
               "max %.1f), %.2f GB/s per direction\n",
               len, conns, chunk, t[RUNS / 2], t[0], t[RUNS - 1], len / t[RUNS / 2] / 1e3);
        wait(NULL);
    }
    return 0;
}
