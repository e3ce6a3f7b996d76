/* An LD_PRELOAD shim for tests: CLOCK_REALTIME (what SystemTime::now reads) shifted by
 * the milliseconds written in the file named by CWR_SKEW_FILE, read at every call, so a
 * test can set a process's wall clock ahead and step it while it runs. Other clocks
 * (the monotonic one Instant reads) are left alone. Built by the test that uses it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int clock_gettime(clockid_t id, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int r = real(id, ts);
    const char *path = getenv("CWR_SKEW_FILE");
    if (r != 0 || id != CLOCK_REALTIME || !path) return r;
    FILE *f = fopen(path, "r");
    if (!f) return r;
    long long ms = 0;
    if (fscanf(f, "%lld", &ms) == 1) {
        long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + ms * 1000000LL;
        ts->tv_sec = ns / 1000000000LL;
        ts->tv_nsec = ns % 1000000000LL;
    }
    fclose(f);
    return r;
}
