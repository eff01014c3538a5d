/*
 * The floor of a 2-rank all-reduce's exchange over loopback TCP, with no reduction: two
 * processes, each call both send LEN bytes and receive the other's LEN bytes (what both ranks
 * of a one-exchange all-reduce do). Three ways:
 *   0: send all, then spin on recv(MSG_DONTWAIT)  (what oxccl's TCP inbox does since 2026-11-27)
 *   1: send all, then spin on poll(timeout 0) and recv  (what it did before)
 *   2: send and receive non-blocking and interleaved, as oxccl's engine does (for LEN larger
 *      than the socket buffers, where sending all first would deadlock)
 * over one connection (CONNS=1) or two, one per direction (CONNS=2, as oxccl's TCP links have
 * since 2026-12-05). Prints the time per exchange (median of 5 runs of 100,000 exchanges, 2,000
 * from 1 MiB).
 *
 *   cc -O2 -o /tmp/tcp_exchange tools/perf/tcp_exchange.c && /tmp/tcp_exchange [MODE] [LEN] [CONNS]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
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

/* Mode 2: both directions at once, never blocking. */
static void interleave(int tx, int rx, const char *out, char *in, size_t len) {
    size_t sent = 0, got = 0;
    while (sent < len || got < len) {
        if (sent < len) {
            ssize_t r = send(tx, out + sent, len - sent, MSG_DONTWAIT);
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

static void exchange(int mode, int tx, int rx, const char *out, char *in, size_t len) {
    if (mode == 2) {
        interleave(tx, rx, out, in, len);
    } else {
        send_all(tx, out, len);
        recv_all(rx, in, len, mode);
    }
}

int main(int argc, char **argv) {
    int mode = argc > 1 ? atoi(argv[1]) : 0, one = 1;
    size_t len = argc > 2 ? (size_t)atol(argv[2]) : 8;
    int conns = argc > 3 ? atoi(argv[3]) : 1;
    if (len == 0) len = 1;
    if (mode < 0 || mode > 2 || (conns != 1 && conns != 2)) {
        fprintf(stderr, "usage: %s [MODE 0-2] [LEN] [CONNS 1-2]\n", argv[0]);
        return 2;
    }
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (bind(ls, (void *)&a, sizeof a) || listen(ls, 2) || getsockname(ls, (void *)&a, &al)) {
        perror("bind/listen");
        return 1;
    }
    char *out = malloc(len), *in = malloc(len);
    memset(out, 1, len);
    pid_t pid = fork();
    /* The child connects once per connection; with two, it sends on the first. */
    int fds[2];
    for (int c = 0; c < conns; c++) {
        if (pid == 0) {
            fds[c] = socket(AF_INET, SOCK_STREAM, 0);
            if (connect(fds[c], (void *)&a, sizeof a)) { perror("connect"); return 1; }
        } else {
            fds[c] = accept(ls, NULL, NULL);
        }
        setsockopt(fds[c], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (mode == 2) fcntl(fds[c], F_SETFL, O_NONBLOCK);
    }
    int tx = fds[0], rx = fds[conns - 1];
    if (pid != 0 && conns == 2) { tx = fds[1]; rx = fds[0]; }
    int exchanges = len >= (1 << 20) ? 2000 : 100000;
    for (int i = 0; i < exchanges / 100; i++) exchange(mode, tx, rx, out, in, len);
    double t[RUNS];
    for (int k = 0; k < RUNS; k++) {
        double start = now();
        for (int i = 0; i < exchanges; i++) exchange(mode, tx, rx, out, in, len);
        t[k] = (now() - start) / exchanges * 1e6;
    }
    if (pid != 0) {
        static const char *how[] = {"spinning on recv", "poll, then recv", "interleaved"};
        qsort(t, RUNS, sizeof t[0], cmp);
        printf("exchange of %zu B, %s, %d connection(s): %.2f us (min %.2f, max %.2f), %.2f GB/s "
               "per direction\n", len, how[mode], conns, t[RUNS / 2], t[0], t[RUNS - 1],
               len / t[RUNS / 2] / 1e3);
        wait(NULL);
    }
    return 0;
}
