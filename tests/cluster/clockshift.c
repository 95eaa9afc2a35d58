/*
 * A stand-in server's wall clock, off by TESTBED_CLOCK_OFFSET_NS (LD_PRELOAD into every ssh session).
 *
 * Only CLOCK_REALTIME (and its coarse variant, gettimeofday, time) is shifted: that is the clock two real
 * servers disagree on.  The monotonic clocks stay the kernel's, so timed waits (sem_clockwait, futexes,
 * clock_nanosleep), which wait on them, take the time they say.  libfaketime 0.9.10 (Debian 12) also fakes
 * the monotonic clock with wall-clock values, and Python's timed lock waits then never time out (an
 * Event.wait(0.1) loop ticked twice in 6 s) -- a stand-in that behaves like no real server.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long long offset_ns;
static int (*real_clock_gettime)(clockid_t, struct timespec *);

__attribute__((constructor)) static void init(void)
{
    const char *s = getenv("TESTBED_CLOCK_OFFSET_NS");
    offset_ns = s ? atoll(s) : 0;
    real_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
}

int clock_gettime(clockid_t clock, struct timespec *ts)
{
    if (!real_clock_gettime)
        init();
    int r = real_clock_gettime(clock, ts);
    if (r == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_ns;
        ts->tv_sec = ns / 1000000000LL;
        ts->tv_nsec = ns % 1000000000LL;
    }
    return r;
}

int gettimeofday(struct timeval *tv, void *tz)
{
    struct timespec ts;
    int r = clock_gettime(CLOCK_REALTIME, &ts);
    (void)tz;
    if (r == 0 && tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return r;
}

time_t time(time_t *t)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t)
        *t = ts.tv_sec;
    return ts.tv_sec;
}
