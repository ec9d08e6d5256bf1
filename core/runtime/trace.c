/* The Chrome/Perfetto timeline: spans kept in memory while a run goes,
 * written as one JSON file at the end (one process per rank, one thread per
 * lane). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/status.h"
#include "runtime/log.h"
#include "runtime/trace.h"

typedef struct span {
    char name[48];
    uint64_t start_ns, end_ns, bytes;
    int lane;
} span;

typedef struct counter_sample {
    char name[48];
    uint64_t ts_ns;
    int nkeys;
    const char *keys[LOOM_TRACE_COUNTER_KEYS];
    double values[LOOM_TRACE_COUNTER_KEYS];
} counter_sample;

static pthread_mutex_t trace_lock = PTHREAD_MUTEX_INITIALIZER;
static int trace_on;
static int trace_rank;
static span *spans;
static size_t nspans, capspans;
static counter_sample *samples;
static size_t nsamples, capsamples;

void loom_trace_enable(int rank)
{
    trace_on = 1;
    trace_rank = rank;
}

int loom_trace_enabled(void) { return trace_on; }

void loom_trace_span(loom_trace_lane lane, const char *name, uint64_t start_ns,
                     uint64_t end_ns, uint64_t bytes)
{
    if (!trace_on)
        return;
    pthread_mutex_lock(&trace_lock);
    if (nspans == capspans) {
        size_t cap = capspans ? 2 * capspans : 4096;
        span *grown = realloc(spans, cap * sizeof *spans);
        if (!grown) {
            pthread_mutex_unlock(&trace_lock);
            return; /* a trace is best effort; the run must not fail for it */
        }
        spans = grown;
        capspans = cap;
    }
    span *s = &spans[nspans++];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->start_ns = start_ns;
    s->end_ns = end_ns;
    s->bytes = bytes;
    s->lane = (int)lane;
    pthread_mutex_unlock(&trace_lock);
}

void loom_trace_counters(const char *name, uint64_t ts_ns, const char *const *keys,
                         const double *values, int nkeys)
{
    if (!trace_on)
        return;
    pthread_mutex_lock(&trace_lock);
    if (nsamples == capsamples) {
        size_t cap = capsamples ? 2 * capsamples : 256;
        counter_sample *grown = realloc(samples, cap * sizeof *samples);
        if (!grown) {
            pthread_mutex_unlock(&trace_lock);
            return;
        }
        samples = grown;
        capsamples = cap;
    }
    counter_sample *c = &samples[nsamples++];
    snprintf(c->name, sizeof c->name, "%s", name);
    c->ts_ns = ts_ns;
    c->nkeys = nkeys < LOOM_TRACE_COUNTER_KEYS ? nkeys : LOOM_TRACE_COUNTER_KEYS;
    for (int k = 0; k < c->nkeys; k++) {
        c->keys[k] = keys[k];
        c->values[k] = values[k];
    }
    pthread_mutex_unlock(&trace_lock);
}

/* One JSON object per line, no separators: a rank's part of the timeline. */
static void write_events(FILE *f)
{
    static const char *lanes[] = {"compute", "comm", "memory"};
    for (int l = 0; l < 3; l++)
        fprintf(f,
                "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                "\"args\":{\"name\":\"%s\"}}\n",
                trace_rank, l, lanes[l]);
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}}\n",
            trace_rank, trace_rank);
    for (size_t i = 0; i < nspans; i++) {
        const span *s = &spans[i];
        fprintf(f,
                "{\"name\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,"
                "\"dur\":%.3f,\"args\":{\"bytes\":%llu}}\n",
                s->name, trace_rank, s->lane, (double)s->start_ns / 1e3,
                (double)(s->end_ns - s->start_ns) / 1e3, (unsigned long long)s->bytes);
    }
    for (size_t i = 0; i < nsamples; i++) {
        const counter_sample *c = &samples[i];
        fprintf(f, "{\"name\":\"%s\",\"ph\":\"C\",\"pid\":%d,\"ts\":%.3f,\"args\":{", c->name,
                trace_rank, (double)c->ts_ns / 1e3);
        for (int k = 0; k < c->nkeys; k++)
            fprintf(f, "%s\"%s\":%.6g", k ? "," : "", c->keys[k], c->values[k]);
        fprintf(f, "}}\n");
    }
}

int loom_trace_write_part(const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return loom_fail(LOOM_ERR_INVALID, "trace: cannot write '%s': %s", path, strerror(errno));
    pthread_mutex_lock(&trace_lock);
    write_events(f);
    pthread_mutex_unlock(&trace_lock);
    if (fclose(f) != 0)
        return loom_fail(LOOM_ERR_INVALID, "trace: cannot write '%s': %s", path, strerror(errno));
    return LOOM_OK;
}

int loom_trace_merge(const char *path, const char *const *parts, int nparts)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%.4000s.tmp", path);
    FILE *out = fopen(tmp, "w");
    if (!out)
        return loom_fail(LOOM_ERR_INVALID, "trace: cannot write '%s': %s", path, strerror(errno));
    fprintf(out, "{\"traceEvents\":[\n");
    int first = 1, rc = LOOM_OK;
    char line[1024];
    for (int i = 0; i < nparts && rc == LOOM_OK; i++) {
        FILE *in = fopen(parts[i], "r");
        if (!in) {
            rc = loom_fail(LOOM_ERR_NOT_FOUND,
                           "trace: rank %d's part '%s' is missing (%s); on several machines, "
                           "collect the parts by hand",
                           i, parts[i], strerror(errno));
            break;
        }
        /* an event longer than the buffer arrives in pieces: separate events only */
        int event_start = 1;
        while (fgets(line, sizeof line, in)) {
            size_t n = strlen(line);
            int event_end = n > 0 && line[n - 1] == '\n';
            if (event_end)
                line[n - 1] = '\0';
            fprintf(out, "%s%s", event_start && !first ? ",\n" : "", line);
            first = 0;
            event_start = event_end;
        }
        fclose(in);
        remove(parts[i]);
    }
    fprintf(out, "\n]}\n");
    if (fclose(out) != 0 && rc == LOOM_OK)
        rc = loom_fail(LOOM_ERR_INVALID, "trace: cannot write '%s': %s", path, strerror(errno));
    if (rc == LOOM_OK && rename(tmp, path) != 0)
        rc = loom_fail(LOOM_ERR_INVALID, "trace: cannot write '%s': %s", path, strerror(errno));
    if (rc != LOOM_OK)
        remove(tmp);
    return rc;
}
