/*
 * The floor of a 2-rank small all-reduce over loopback TCP: two processes, one connection,
 * each call both send LEN bytes and then wait until the other's LEN bytes have arrived (what
 * both ranks of a one-exchange all-reduce do). Two ways to wait:
 *   0: spin on recv(MSG_DONTWAIT)            (what oxccl's TCP inbox does since 2026-11-27)
 *   1: spin on poll(timeout 0), then recv    (what it did before)
 * Prints the time per exchange (median of 5 runs of 100,000 exchanges).
 *
 *   cc -O2 -o /tmp/tcp_exchange tools/perf/tcp_exchange.c && /tmp/tcp_exchange [MODE] [LEN]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define EXCHANGES 100000
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

static void send_all(int fd, const char *b, size_t n) {
    while (n) {
        ssize_t r = send(fd, b, n, 0);
        if (r <= 0) { perror("send"); exit(1); }
        b += r;
        n -= (size_t)r;
    }
}

static void recv_all(int fd, char *b, size_t n, int mode) {
    while (n) {
        if (mode == 1) {
            struct pollfd p = {fd, POLLIN, 0};
            while (poll(&p, 1, 0) == 0) {
            }
        }
        ssize_t r = recv(fd, b, n, MSG_DONTWAIT);
        if (r > 0) {
            b += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) { perror("recv"); exit(1); }
    }
}

int main(int argc, char **argv) {
    int mode = argc > 1 ? atoi(argv[1]) : 0, one = 1;
    size_t len = argc > 2 ? (size_t)atol(argv[2]) : 8;
    if (len == 0) len = 1;
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (bind(ls, (void *)&a, sizeof a) || listen(ls, 1) || getsockname(ls, (void *)&a, &al)) {
        perror("bind/listen");
        return 1;
    }
    char *out = malloc(len), *in = malloc(len);
    memset(out, 1, len);
    pid_t pid = fork();
    int fd;
    if (pid == 0) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, (void *)&a, sizeof a)) { perror("connect"); return 1; }
    } else {
        fd = accept(ls, NULL, NULL);
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (int i = 0; i < 1000; i++) {
        send_all(fd, out, len);
        recv_all(fd, in, len, mode);
    }
    double t[RUNS];
    for (int k = 0; k < RUNS; k++) {
        double start = now();
        for (int i = 0; i < EXCHANGES; i++) {
            send_all(fd, out, len);
            recv_all(fd, in, len, mode);
        }
        t[k] = (now() - start) / EXCHANGES * 1e6;
    }
    if (pid != 0) {
        qsort(t, RUNS, sizeof t[0], cmp);
        printf("exchange of %zu B, %s: %.2f us (min %.2f, max %.2f)\n", len,
               mode ? "poll, then recv" : "spinning on recv", t[RUNS / 2], t[0], t[RUNS - 1]);
        wait(NULL);
    }
    return 0;
}
