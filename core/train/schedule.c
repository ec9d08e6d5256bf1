/* Pipeline schedules as data: building, validating, simulating and drawing
 * the per-rank action lists (see schedule.h for the conventions). */
#include "loom/schedule.h"
#include "loom/status.h"
#include "runtime/log.h"
#include "train/schedule.h"

#include <stdlib.h>
#include <string.h>


/* ---------------------------------------------------------------- names */

const char *loom_action_kind_name(int kind)
{
    static const char *names[LOOM_ACT_KIND_COUNT] = {
        "forward",         "backward",        "backward-input", "backward-weight",
        "send activation", "recv activation", "send gradient",  "recv gradient"};
    return kind >= 0 && kind < LOOM_ACT_KIND_COUNT ? names[kind] : "unknown";
}

int loom_action_is_compute(int kind)
{
    return kind == LOOM_ACT_FORWARD || kind == LOOM_ACT_BACKWARD ||
           kind == LOOM_ACT_BACKWARD_INPUT || kind == LOOM_ACT_BACKWARD_WEIGHT;
}

/* "action 7 (backward mb 2, virtual stage 0 = stage 1)" */
static void describe_at(const loom_schedule *s, int rank, int index, char *buf, size_t cap)
{
    loom_action a = s->actions[rank][index];
    char kind[32];
    if (a.kind < LOOM_ACT_KIND_COUNT)
        snprintf(kind, sizeof kind, "%s", loom_action_kind_name(a.kind));
    else
        snprintf(kind, sizeof kind, "kind %u", (unsigned)a.kind);
    snprintf(buf, cap, "action %d (%s mb %d, virtual stage %u = stage %d)", index, kind,
             (int)a.microbatch, (unsigned)a.virtual_stage,
             loom_schedule_stage(s, rank, a.virtual_stage));
}

void loom_action_describe(const loom_schedule *s, int rank, int index, char *buf, size_t cap)
{
    char at[128];
    describe_at(s, rank, index, at, sizeof at);
    snprintf(buf, cap, "rank %d, %s", rank, at);
}

/* ------------------------------------------------------------- building */

void loom_schedule_free(loom_schedule *s)
{
    if (!s)
        return;
    for (int r = 0; s->actions && r < s->stages; r++)
        free(s->actions[r]);
    free(s->actions);
    free(s->count);
    free(s->cap);
    memset(s, 0, sizeof *s);
}

int loom_schedule_init(loom_schedule *s, const char *name, int stages, int virtual_stages,
                       int microbatches)
{
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name ? name : "?");
    if (stages < 1 || virtual_stages < 1 || microbatches < 1)
        return loom_fail(LOOM_ERR_INVALID,
                         "schedule \"%s\": %d ranks, %d virtual stages, %d micro-batches: "
                         "each must be at least 1", s->name, stages, virtual_stages,
                         microbatches);
    s->stages = stages;
    s->virtual_stages = virtual_stages;
    s->microbatches = microbatches;
    s->count = calloc((size_t)stages, sizeof *s->count);
    s->cap = calloc((size_t)stages, sizeof *s->cap);
    s->actions = calloc((size_t)stages, sizeof *s->actions);
    if (!s->count || !s->cap || !s->actions) {
        loom_schedule_free(s);
        return loom_fail(LOOM_ERR_NO_MEMORY, "schedule: out of memory");
    }
    return LOOM_OK;
}

int loom_schedule_append(loom_schedule *s, int rank, loom_action action)
{
    if (rank < 0 || rank >= s->stages)
        return loom_fail(LOOM_ERR_INVALID,
                         "schedule \"%s\": an action for rank %d, but the pipeline has ranks "
                         "0..%d", s->name, rank, s->stages - 1);
    /* Far more actions than any schedule needs means a runaway generator. */
    long limit = 64L * s->virtual_stages * s->microbatches + 64;
    if (s->count[rank] >= limit)
        return loom_fail(LOOM_ERR_INVALID,
                         "schedule \"%s\": rank %d's list passed %ld actions for %d virtual "
                         "stages and %d micro-batches; the generator does not stop",
                         s->name, rank, limit, s->virtual_stages, s->microbatches);
    if (s->count[rank] == s->cap[rank]) {
        int cap = s->cap[rank] ? 2 * s->cap[rank] : 64;
        loom_action *grown = realloc(s->actions[rank], (size_t)cap * sizeof *grown);
        if (!grown)
            return loom_fail(LOOM_ERR_NO_MEMORY, "schedule: out of memory");
        s->actions[rank] = grown;
        s->cap[rank] = cap;
    }
    s->actions[rank][s->count[rank]++] = action;
    return LOOM_OK;
}

static int emit_action(void *builder, int pp_rank, loom_action action)
{
    return loom_schedule_append(builder, pp_rank, action);
}

int loom_schedule_build(const loom_plugin *plugin, const loom_host *host, int stages,
                        int virtual_stages, int microbatches, loom_schedule *out)
{
    const char *name = plugin->header->name;
    int rc = loom_schedule_init(out, name, stages, virtual_stages, microbatches);
    if (rc != LOOM_OK)
        return rc;
    loom_pipeline_shape shape;
    memset(&shape, 0, sizeof shape);
    shape.stages = stages;
    shape.virtual_stages = virtual_stages;
    shape.microbatches = microbatches;
    shape.builder = out;
    shape.emit = emit_action;
    loom_clear_error();
    rc = loom_plugin_schedule_build(plugin, host, &shape);
    if (rc != LOOM_OK) {
        if (!*loom_last_error())
            loom_fail(rc, "schedule \"%s\": the plugin failed (status %d) without saying why",
                      name, rc);
        loom_schedule_free(out);
        return rc;
    }
    if ((rc = loom_schedule_validate(out)) != LOOM_OK)
        loom_schedule_free(out);
    return rc;
}

/* ----------------------------------------------------------- validation */

/* Where each (kind, stage, mb) sits in its stage's rank list, -1: nowhere.
 * One table per kind, indexed stage·m + mb. */
typedef struct action_index {
    int S, m;
    int *at[LOOM_ACT_KIND_COUNT];
} action_index;

static void index_free(action_index *ix)
{
    for (int k = 0; k < LOOM_ACT_KIND_COUNT; k++)
        free(ix->at[k]);
}

static int index_init(action_index *ix, const loom_schedule *s)
{
    memset(ix, 0, sizeof *ix);
    ix->S = s->stages * s->virtual_stages;
    ix->m = s->microbatches;
    size_t n = (size_t)ix->S * (size_t)ix->m;
    for (int k = 0; k < LOOM_ACT_KIND_COUNT; k++) {
        if (!(ix->at[k] = malloc(n * sizeof(int)))) {
            index_free(ix);
            return loom_fail(LOOM_ERR_NO_MEMORY, "schedule: out of memory");
        }
        for (size_t i = 0; i < n; i++)
            ix->at[k][i] = -1;
    }
    return LOOM_OK;
}

static int *slot(const action_index *ix, int kind, int stage, int mb)
{
    return &ix->at[kind][(size_t)stage * (size_t)ix->m + (size_t)mb];
}

/* One refusal line: schedule "name": rank r, action i (...): why. */
static int refuse(const loom_schedule *s, int rank, int index, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int refuse(const loom_schedule *s, int rank, int index, const char *fmt, ...)
{
    char what[160], why[512];
    loom_action_describe(s, rank, index, what, sizeof what);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return loom_fail(LOOM_ERR_INVALID, "schedule \"%s\": %s: %s", s->name, what, why);
}

/* An action's kind, virtual stage and micro-batch exist, and its send or
 * receive has a neighbour stage. */
static int check_action_fields(const loom_schedule *s, int r, int i, loom_action a)
{
    int v = s->virtual_stages, m = s->microbatches, S = s->stages * v;
    if (a.kind >= LOOM_ACT_KIND_COUNT)
        return refuse(s, r, i, "unknown action kind %u (kinds are 0..%d)", (unsigned)a.kind,
                      LOOM_ACT_KIND_COUNT - 1);
    if (a.virtual_stage >= v)
        return refuse(s, r, i, "virtual stage %u does not exist (%d per rank)",
                      (unsigned)a.virtual_stage, v);
    if (a.microbatch < 0 || a.microbatch >= m)
        return refuse(s, r, i, "micro-batch %d does not exist (the step has 0..%d)",
                      (int)a.microbatch, m - 1);
    int st = loom_schedule_stage(s, r, a.virtual_stage);
    int first = st == 0, last = st == S - 1;
    switch (a.kind) {
    case LOOM_ACT_RECV_ACTIVATION:
        if (first)
            return refuse(s, r, i, "stage 0 has no previous stage to receive from");
        break;
    case LOOM_ACT_SEND_ACTIVATION:
        if (last)
            return refuse(s, r, i, "the last stage has no next stage to send to");
        break;
    case LOOM_ACT_RECV_GRADIENT:
        if (last)
            return refuse(s, r, i, "the last stage has no next stage to receive from");
        break;
    case LOOM_ACT_SEND_GRADIENT:
        if (first)
            return refuse(s, r, i, "stage 0 has no previous stage to send to");
        break;
    default: break;
    }
    return LOOM_OK;
}

/* An action's first appearance, and what must have run before it on this
 * rank, against the index of the actions before it. */
static int check_action_order(const loom_schedule *s, int r, int i, loom_action a, action_index *ix)
{
    int S = s->stages * s->virtual_stages;
    int st = loom_schedule_stage(s, r, a.virtual_stage), mb = a.microbatch;
    int first = st == 0, last = st == S - 1;
    int earlier = *slot(ix, a.kind, st, mb);
    if (earlier >= 0)
        return refuse(s, r, i, "appears a second time (first at action %d)", earlier);
    int whole = *slot(ix, LOOM_ACT_BACKWARD, st, mb);
    int input = *slot(ix, LOOM_ACT_BACKWARD_INPUT, st, mb);
    int weight = *slot(ix, LOOM_ACT_BACKWARD_WEIGHT, st, mb);
    int forward = *slot(ix, LOOM_ACT_FORWARD, st, mb);
    if (a.kind == LOOM_ACT_BACKWARD && (input >= 0 || weight >= 0))
        return refuse(s, r, i, "mixes a whole backward with the split one (%s at action %d)",
                      input >= 0 ? "backward-input" : "backward-weight",
                      input >= 0 ? input : weight);
    if ((a.kind == LOOM_ACT_BACKWARD_INPUT || a.kind == LOOM_ACT_BACKWARD_WEIGHT) && whole >= 0)
        return refuse(s, r, i,
                      "mixes the split backward with a whole backward (at "
                      "action %d)",
                      whole);
    switch (a.kind) {
    case LOOM_ACT_FORWARD:
        if (!first && *slot(ix, LOOM_ACT_RECV_ACTIVATION, st, mb) < 0)
            return refuse(s, r, i,
                          "its input has not been received (no recv activation "
                          "before it)");
        break;
    case LOOM_ACT_SEND_ACTIVATION:
        if (forward < 0)
            return refuse(s, r, i, "its forward has not run on this rank");
        break;
    case LOOM_ACT_BACKWARD:
    case LOOM_ACT_BACKWARD_INPUT:
        if (forward < 0)
            return refuse(s, r, i, "its forward has not run on this rank");
        if (!last && *slot(ix, LOOM_ACT_RECV_GRADIENT, st, mb) < 0)
            return refuse(s, r, i,
                          "its output gradient has not been received (no recv "
                          "gradient before it)");
        break;
    case LOOM_ACT_BACKWARD_WEIGHT:
        if (input < 0)
            return refuse(s, r, i, "its backward-input has not run on this rank");
        break;
    case LOOM_ACT_SEND_GRADIENT:
        if (whole < 0 && input < 0)
            return refuse(s, r, i, "its backward has not run on this rank");
        break;
    default: break;
    }
    return LOOM_OK;
}

/* Kinds, ranges, borders, duplicates and dependencies of one rank's list,
 * recording each action in the index. */
static int check_rank_list(const loom_schedule *s, int r, action_index *ix)
{
    for (int i = 0; i < s->count[r]; i++) {
        loom_action a = s->actions[r][i];
        int rc = check_action_fields(s, r, i, a);
        if (rc == LOOM_OK)
            rc = check_action_order(s, r, i, a, ix);
        if (rc != LOOM_OK)
            return rc;
        int st = loom_schedule_stage(s, r, a.virtual_stage);
        *slot(ix, a.kind, st, a.microbatch) = i;
    }
    return LOOM_OK;
}

/* The action a send or receive pairs with: its kind and stage. */
static void counterpart(int kind, int stage, int *peer_kind, int *peer_stage)
{
    switch (kind) {
    case LOOM_ACT_SEND_ACTIVATION:
        *peer_kind = LOOM_ACT_RECV_ACTIVATION;
        *peer_stage = stage + 1;
        break;
    case LOOM_ACT_RECV_ACTIVATION:
        *peer_kind = LOOM_ACT_SEND_ACTIVATION;
        *peer_stage = stage - 1;
        break;
    case LOOM_ACT_SEND_GRADIENT:
        *peer_kind = LOOM_ACT_RECV_GRADIENT;
        *peer_stage = stage - 1;
        break;
    case LOOM_ACT_RECV_GRADIENT:
        *peer_kind = LOOM_ACT_SEND_GRADIENT;
        *peer_stage = stage + 1;
        break;
    default: *peer_kind = -1; *peer_stage = -1;
    }
}

static int is_send(int kind)
{
    return kind == LOOM_ACT_SEND_ACTIVATION || kind == LOOM_ACT_SEND_GRADIENT;
}

static int is_recv(int kind)
{
    return kind == LOOM_ACT_RECV_ACTIVATION || kind == LOOM_ACT_RECV_GRADIENT;
}

static int check_matching(const loom_schedule *s, const action_index *ix)
{
    for (int r = 0; r < s->stages; r++)
        for (int i = 0; i < s->count[r]; i++) {
            loom_action a = s->actions[r][i];
            if (!is_send(a.kind) && !is_recv(a.kind))
                continue;
            int st = loom_schedule_stage(s, r, a.virtual_stage), pk, ps;
            counterpart(a.kind, st, &pk, &ps);
            if (*slot(ix, pk, ps, a.microbatch) >= 0)
                continue;
            if (is_send(a.kind))
                return refuse(s, r, i, "rank %d never receives it (no %s mb %d for stage %d)",
                              loom_schedule_rank_of(s, ps), loom_action_kind_name(pk),
                              (int)a.microbatch, ps);
            return refuse(s, r, i, "no rank sends it (rank %d has no %s mb %d for stage %d)",
                          loom_schedule_rank_of(s, ps), loom_action_kind_name(pk),
                          (int)a.microbatch, ps);
        }
    return LOOM_OK;
}

/* Everything each (stage, mb) needs is there: a backward for every
 * forward, the weight half of every split backward, the sends. */
static int check_complete(const loom_schedule *s, const action_index *ix)
{
    int p = s->stages, v = s->virtual_stages, m = s->microbatches, S = p * v;
    for (int r = 0; r < p; r++) {
        for (int i = 0; i < s->count[r]; i++) {
            loom_action a = s->actions[r][i];
            int st = loom_schedule_stage(s, r, a.virtual_stage), mb = a.microbatch;
            if (a.kind == LOOM_ACT_FORWARD) {
                if (*slot(ix, LOOM_ACT_BACKWARD, st, mb) < 0 &&
                    *slot(ix, LOOM_ACT_BACKWARD_INPUT, st, mb) < 0)
                    return refuse(s, r, i, "its backward is missing");
                if (st < S - 1 && *slot(ix, LOOM_ACT_SEND_ACTIVATION, st, mb) < 0)
                    return refuse(s, r, i, "its output is never sent to stage %d", st + 1);
            }
            if (a.kind == LOOM_ACT_BACKWARD_INPUT &&
                *slot(ix, LOOM_ACT_BACKWARD_WEIGHT, st, mb) < 0)
                return refuse(s, r, i, "its backward-weight is missing");
            if ((a.kind == LOOM_ACT_BACKWARD || a.kind == LOOM_ACT_BACKWARD_INPUT) && st > 0 &&
                *slot(ix, LOOM_ACT_SEND_GRADIENT, st, mb) < 0)
                return refuse(s, r, i, "its input gradient is never sent to stage %d", st - 1);
        }
        for (int vs = 0; vs < v; vs++)
            for (int mb = 0; mb < m; mb++) {
                int st = loom_schedule_stage(s, r, vs);
                if (*slot(ix, LOOM_ACT_FORWARD, st, mb) < 0)
                    return loom_fail(LOOM_ERR_INVALID,
                                     "schedule \"%s\": rank %d, virtual stage %d = stage %d: "
                                     "micro-batch %d has no forward", s->name, r, vs, st, mb);
            }
    }
    return LOOM_OK;
}

/* Where the send a receive waits for sits: its rank and index. */
static void send_of(const loom_schedule *s, const action_index *ix, int r, loom_action a,
                    int *peer_rank, int *peer_index)
{
    int pk, ps;
    counterpart(a.kind, loom_schedule_stage(s, r, a.virtual_stage), &pk, &ps);
    *peer_rank = loom_schedule_rank_of(s, ps);
    *peer_index = *slot(ix, pk, ps, a.microbatch);
}

/* Run every rank's program counter as far as it goes: sends never block,
 * a receive waits for its send. Stuck with work left is a deadlock; the
 * message follows the waits from the lowest blocked rank until they close
 * a cycle. */
static int check_deadlock(const loom_schedule *s, const action_index *ix)
{
    int p = s->stages;
    int *pc = calloc((size_t)p, sizeof *pc);
    if (!pc)
        return loom_fail(LOOM_ERR_NO_MEMORY, "schedule: out of memory");
    for (int progress = 1; progress;) {
        progress = 0;
        for (int r = 0; r < p; r++)
            while (pc[r] < s->count[r]) {
                loom_action a = s->actions[r][pc[r]];
                if (is_recv(a.kind)) {
                    int pr, pi;
                    send_of(s, ix, r, a, &pr, &pi);
                    if (pc[pr] <= pi)
                        break;
                }
                pc[r]++;
                progress = 1;
            }
    }
    int blocked = -1;
    for (int r = 0; r < p && blocked < 0; r++)
        if (pc[r] < s->count[r])
            blocked = r;
    if (blocked < 0) {
        free(pc);
        return LOOM_OK;
    }
    char msg[1024], at[128];
    size_t len = 0;
    char *visited = calloc((size_t)p, 1);
    int r = blocked;
    len += (size_t)snprintf(msg, sizeof msg, "deadlock: ");
    for (int hops = 0; visited && hops < p && len < sizeof msg; hops++) {
        visited[r] = 1;
        int pr, pi;
        send_of(s, ix, r, s->actions[r][pc[r]], &pr, &pi);
        describe_at(s, r, pc[r], at, sizeof at);
        if (hops == 0)
            len += (size_t)snprintf(msg + len, sizeof msg - len, "rank %d waits at %s for rank %d",
                                    r, at, pr);
        else
            len += (size_t)snprintf(msg + len, sizeof msg - len, ", which waits at %s for rank %d",
                                    at, pr);
        if (visited[pr] || pc[pr] >= s->count[pr])
            break;
        r = pr;
    }
    free(visited);
    free(pc);
    return loom_fail(LOOM_ERR_INVALID, "schedule \"%s\": %s", s->name, msg);
}

int loom_schedule_validate(const loom_schedule *s)
{
    if (s->stages < 2)
        return loom_fail(LOOM_ERR_INVALID, "schedule \"%s\": a pipeline needs 2 or more ranks "
                         "(got %d)", s->name, s->stages);
    if (s->virtual_stages < 1 || s->microbatches < 1)
        return loom_fail(LOOM_ERR_INVALID, "schedule \"%s\": %d virtual stages and %d "
                         "micro-batches; each must be at least 1", s->name, s->virtual_stages,
                         s->microbatches);
    action_index ix;
    int rc = index_init(&ix, s);
    for (int r = 0; rc == LOOM_OK && r < s->stages; r++)
        rc = check_rank_list(s, r, &ix);
    if (rc == LOOM_OK)
        rc = check_matching(s, &ix);
    if (rc == LOOM_OK)
        rc = check_complete(s, &ix);
    if (rc == LOOM_OK)
        rc = check_deadlock(s, &ix);
    index_free(&ix);
    return rc;
}

/* ----------------------------------------------------------- simulation */

void loom_schedule_default_costs(double cost[LOOM_ACT_KIND_COUNT])
{
    for (int k = 0; k < LOOM_ACT_KIND_COUNT; k++)
        cost[k] = 0.0;
    cost[LOOM_ACT_FORWARD] = 1.0;
    cost[LOOM_ACT_BACKWARD_INPUT] = 1.0;
    cost[LOOM_ACT_BACKWARD_WEIGHT] = 1.0;
    cost[LOOM_ACT_BACKWARD] = 2.0;
}

void loom_schedule_timeline_free(const loom_schedule *s, loom_schedule_timeline *tl)
{
    if (!tl)
        return;
    for (int r = 0; s && r < s->stages; r++) {
        if (tl->start)
            free(tl->start[r]);
        if (tl->end)
            free(tl->end[r]);
        if (tl->arrival)
            free(tl->arrival[r]);
    }
    free(tl->start);
    free(tl->end);
    free(tl->arrival);
    free(tl->busy);
    free(tl->peak_stash);
    memset(tl, 0, sizeof *tl);
}

/* The timeline's arrays, one start and end per action and rank. */
static int timeline_alloc(const loom_schedule *s, loom_schedule_timeline *out)
{
    int p = s->stages;
    memset(out, 0, sizeof *out);
    out->start = calloc((size_t)p, sizeof *out->start);
    out->end = calloc((size_t)p, sizeof *out->end);
    out->arrival = calloc((size_t)p, sizeof *out->arrival);
    out->busy = calloc((size_t)p, sizeof *out->busy);
    out->peak_stash = calloc((size_t)p, sizeof *out->peak_stash);
    int ok = out->start && out->end && out->arrival && out->busy && out->peak_stash;
    for (int r = 0; ok && r < p; r++) {
        size_t n = (size_t)s->count[r] + 1;
        ok = (out->start[r] = calloc(n, sizeof(double))) &&
             (out->end[r] = calloc(n, sizeof(double))) &&
             (out->arrival[r] = calloc(n, sizeof(double)));
    }
    if (ok)
        return LOOM_OK;
    loom_schedule_timeline_free(s, out);
    return loom_fail(LOOM_ERR_NO_MEMORY, "schedule: out of memory");
}

/* The deadlock walk again, with clocks: a receive starts when its send's
 * data has arrived (schedule.h). pc: per rank, the actions walked. */
static void walk_clocks(const loom_schedule *s, const double cost[LOOM_ACT_KIND_COUNT],
                        const action_index *ix, int *pc, loom_schedule_timeline *out)
{
    for (int progress = 1; progress;) {
        progress = 0;
        for (int r = 0; r < s->stages; r++)
            while (pc[r] < s->count[r]) {
                int i = pc[r];
                loom_action a = s->actions[r][i];
                double t = i > 0 ? out->end[r][i - 1] : 0.0;
                if (is_recv(a.kind)) {
                    int pr, pi;
                    send_of(s, ix, r, a, &pr, &pi);
                    if (pi < 0 || pc[pr] <= pi)
                        break;
                    out->arrival[r][i] = out->end[pr][pi] + out->transfer;
                    if (out->arrival[r][i] > t)
                        t = out->arrival[r][i];
                }
                out->start[r][i] = t;
                out->end[r][i] = t + cost[a.kind];
                if (loom_action_is_compute(a.kind))
                    out->busy[r] += cost[a.kind];
                if (out->end[r][i] > out->makespan)
                    out->makespan = out->end[r][i];
                pc[r]++;
                progress = 1;
            }
    }
}

/* The stash in list order: forward adds a stage-micro-batch, its last
 * backward action removes it; and the bubble. */
static void count_stash_and_bubble(const loom_schedule *s, loom_schedule_timeline *out)
{
    int p = s->stages;
    double busy = 0.0;
    for (int r = 0; r < p; r++) {
        int live = 0;
        for (int i = 0; i < s->count[r]; i++) {
            int k = s->actions[r][i].kind;
            if (k == LOOM_ACT_FORWARD && ++live > out->peak_stash[r])
                out->peak_stash[r] = live;
            if (k == LOOM_ACT_BACKWARD || k == LOOM_ACT_BACKWARD_WEIGHT)
                live--;
        }
        busy += out->busy[r];
    }
    out->bubble = out->makespan > 0.0 ? 1.0 - busy / ((double)p * out->makespan) : 0.0;
}

int loom_schedule_simulate(const loom_schedule *s, const double cost[LOOM_ACT_KIND_COUNT],
                           loom_schedule_timeline *out)
{
    return loom_schedule_simulate_transfers(s, cost, 0.0, out);
}

int loom_schedule_simulate_transfers(const loom_schedule *s,
                                     const double cost[LOOM_ACT_KIND_COUNT], double transfer,
                                     loom_schedule_timeline *out)
{
    int p = s->stages;
    if (!(transfer >= 0.0))
        return loom_fail(LOOM_ERR_INVALID,
                         "schedule \"%s\": transfer time %g: give 0 or more", s->name,
                         transfer);
    int rc = timeline_alloc(s, out);
    if (rc != LOOM_OK)
        return rc;
    out->transfer = transfer;
    int *pc = calloc((size_t)p, sizeof *pc);
    action_index ix;
    if (!pc || (rc = index_init(&ix, s)) != LOOM_OK) {
        free(pc);
        loom_schedule_timeline_free(s, out);
        return pc ? rc : loom_fail(LOOM_ERR_NO_MEMORY, "schedule: out of memory");
    }
    for (int r = 0; r < p; r++)
        for (int i = 0; i < s->count[r]; i++) {
            loom_action a = s->actions[r][i];
            if (a.kind < LOOM_ACT_KIND_COUNT)
                *slot(&ix, a.kind, loom_schedule_stage(s, r, a.virtual_stage), a.microbatch) = i;
        }
    walk_clocks(s, cost, &ix, pc, out);
    for (int r = 0; r < p; r++)
        if (pc[r] < s->count[r])
            rc = loom_fail(LOOM_ERR_INVALID,
                           "schedule \"%s\": cannot simulate a schedule that "
                           "deadlocks (validate it first)",
                           s->name);
    count_stash_and_bubble(s, out);
    index_free(&ix);
    free(pc);
    if (rc != LOOM_OK)
        loom_schedule_timeline_free(s, out);
    return rc;
}
