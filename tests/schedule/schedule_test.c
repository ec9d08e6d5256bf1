/* Pipeline schedules (core/train/schedule.c and the schedule plugins): every
 * kind of invalid list refused with its exact one-line message naming the
 * offending action, the simulator's clocks on a hand-timed example, every
 * shipped schedule (and the out-of-tree filldrain) valid over p ∈ {2,3,4},
 * m ∈ {p,2p,4p}, their bubble against the closed forms and their
 * activation stash.
 *
 *   schedule_test CASE [FILLDRAIN_SO]    one case ("all" runs every case)
 * The schedule plugins are found through LOOM_PLUGIN_PATH. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/status.h"
#include "loom/strategy.h"
#include "runtime/config.h"
#include "runtime/loader.h"
#include "runtime/log.h"
#include "runtime/runtime.h"
#include "cli/schedule_svg.h"
#include "train/schedule.h"
#include "check.h"

static const char *filldrain_path;

/* ---------------------------------------------------- hand-written lists */

/* One rank's list in the compact notation `loom schedule` prints: F, B, I
 * (backward-input), W (backward-weight), sa/ra (send/recv activation),
 * sg/rg (send/recv gradient), then the micro-batch, then optionally "v"
 * and the virtual stage: "ra0 F0 sa0 rg0 B0 sg0", "F3v1". "K9:0" is kind 9
 * (unknown) for micro-batch 0. */
static void parse_list(loom_schedule *s, int rank, const char *text)
{
    static const struct {
        const char *name;
        int kind;
    } kinds[] = {{"sa", LOOM_ACT_SEND_ACTIVATION}, {"ra", LOOM_ACT_RECV_ACTIVATION},
                 {"sg", LOOM_ACT_SEND_GRADIENT},   {"rg", LOOM_ACT_RECV_GRADIENT},
                 {"F", LOOM_ACT_FORWARD},          {"B", LOOM_ACT_BACKWARD},
                 {"I", LOOM_ACT_BACKWARD_INPUT},   {"W", LOOM_ACT_BACKWARD_WEIGHT}};
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", text);
    for (char *tok = strtok(buf, " "); tok; tok = strtok(NULL, " ")) {
        int kind = -1, vs = 0, mb = 0;
        char *rest = tok;
        if (tok[0] == 'K') {
            kind = (int)strtol(tok + 1, &rest, 10);
            rest++; /* ':' */
        }
        for (size_t k = 0; kind < 0 && k < LOOM_ARRAY_LEN(kinds); k++)
            if (!strncmp(tok, kinds[k].name, strlen(kinds[k].name))) {
                kind = kinds[k].kind;
                rest = tok + strlen(kinds[k].name);
            }
        if (kind < 0) {
            fprintf(stderr, "schedule_test: bad token '%s'\n", tok);
            exit(2);
        }
        mb = (int)strtol(rest, &rest, 10);
        if (*rest == 'v')
            vs = (int)strtol(rest + 1, NULL, 10);
        loom_action a = {(uint16_t)kind, (uint16_t)vs, mb};
        if (loom_schedule_append(s, rank, a) != LOOM_OK) {
            fprintf(stderr, "schedule_test: %s\n", loom_last_error());
            exit(2);
        }
    }
}

static void make(loom_schedule *s, const char *name, int p, int v, int m,
                 const char *const *lists)
{
    if (loom_schedule_init(s, name, p, v, m) != LOOM_OK) {
        fprintf(stderr, "schedule_test: %s\n", loom_last_error());
        exit(2);
    }
    for (int r = 0; r < p; r++)
        parse_list(s, r, lists[r]);
}

/* The lists must be refused with exactly this line. */
static void expect_refusal(const char *name, int p, int v, int m, const char *const *lists,
                           const char *want)
{
    loom_schedule s;
    make(&s, name, p, v, m, lists);
    loom_clear_error();
    int rc = loom_schedule_validate(&s);
    CHECK(rc == LOOM_ERR_INVALID);
    CHECK_STR(loom_last_error(), want);
    loom_schedule_free(&s);
}

static void expect_valid(const char *name, int p, int v, int m, const char *const *lists)
{
    loom_schedule s;
    make(&s, name, p, v, m, lists);
    int rc = loom_schedule_validate(&s);
    if (rc != LOOM_OK)
        fprintf(stderr, "unexpected refusal: %s\n", loom_last_error());
    CHECK(rc == LOOM_OK);
    loom_schedule_free(&s);
}

/* GPipe by hand, p = 2, m = 2: the base the refusals break. */
static const char *const fill_drain[] = {"F0 sa0 F1 sa1 rg0 B0 rg1 B1",
                                         "ra0 F0 ra1 F1 B0 sg0 B1 sg1"};

static void case_valid(void)
{
    expect_valid("by-hand", 2, 1, 2, fill_drain);
    /* split backward, W's late; and a 3-stage chain */
    const char *split[] = {"F0 sa0 F1 sa1 rg0 I0 rg1 I1 W1 W0", "ra0 F0 ra1 F1 I0 sg0 I1 sg1 W0 W1"};
    expect_valid("split", 2, 1, 2, split);
    const char *three[] = {"F0 sa0 rg0 B0", "ra0 F0 sa0 rg0 B0 sg0", "ra0 F0 B0 sg0"};
    expect_valid("three", 3, 1, 1, three);
    /* two virtual stages: stage 2 = vs 1 on rank 0 receives from rank 1 */
    const char *virt[] = {"F0v0 sa0v0 ra0v1 F0v1 sa0v1 rg0v1 B0v1 sg0v1 rg0v0 B0v0",
                          "ra0v0 F0v0 sa0v0 ra0v1 F0v1 B0v1 sg0v1 rg0v0 B0v0 sg0v0"};
    expect_valid("virtual", 2, 2, 1, virt);
}

static void case_missing_backward(void)
{
    const char *lists[] = {"F0 sa0 F1 sa1 rg0 B0 rg1", fill_drain[1]};
    expect_refusal("missing-backward", 2, 1, 2, lists,
                   "schedule \"missing-backward\": rank 0, action 2 (forward mb 1, virtual stage "
                   "0 = stage 0): its backward is missing");
    const char *no_weight[] = {"F0 sa0 F1 sa1 rg0 I0 rg1 I1 W1", "ra0 F0 ra1 F1 I0 sg0 I1 sg1 W0 W1"};
    expect_refusal("missing-weight", 2, 1, 2, no_weight,
                   "schedule \"missing-weight\": rank 0, action 5 (backward-input mb 0, virtual "
                   "stage 0 = stage 0): its backward-weight is missing");
    const char *no_send[] = {"F0 sa0 F1 sa1 rg0 B0 rg1 B1", "ra0 F0 ra1 F1 B0 sg0 B1"};
    expect_refusal("missing-send", 2, 1, 2, no_send,
                   "schedule \"missing-send\": rank 0, action 6 (recv gradient mb 1, virtual "
                   "stage 0 = stage 0): no rank sends it (rank 1 has no send gradient mb 1 for "
                   "stage 1)");
}

static void case_duplicate_forward(void)
{
    const char *lists[] = {"F0 sa0 F0 F1 sa1 rg0 B0 rg1 B1", fill_drain[1]};
    expect_refusal("duplicate-forward", 2, 1, 2, lists,
                   "schedule \"duplicate-forward\": rank 0, action 2 (forward mb 0, virtual "
                   "stage 0 = stage 0): appears a second time (first at action 0)");
}

static void case_backward_before_forward(void)
{
    const char *lists[] = {"rg0 B0 F0 sa0 F1 sa1 rg1 B1", fill_drain[1]};
    expect_refusal("early-backward", 2, 1, 2, lists,
                   "schedule \"early-backward\": rank 0, action 1 (backward mb 0, virtual stage "
                   "0 = stage 0): its forward has not run on this rank");
    const char *no_grad[] = {"F0 sa0 F1 sa1 B0 rg0 rg1 B1", fill_drain[1]};
    expect_refusal("no-gradient", 2, 1, 2, no_grad,
                   "schedule \"no-gradient\": rank 0, action 4 (backward mb 0, virtual stage 0 = "
                   "stage 0): its output gradient has not been received (no recv gradient before "
                   "it)");
    const char *no_input[] = {fill_drain[0], "F0 ra0 ra1 F1 B0 sg0 B1 sg1"};
    expect_refusal("no-input", 2, 1, 2, no_input,
                   "schedule \"no-input\": rank 1, action 0 (forward mb 0, virtual stage 0 = stage "
                   "1): its input has not been received (no recv activation before it)");
    const char *weight_first[] = {"F0 sa0 F1 sa1 rg0 W0 I0 rg1 I1 W1",
                                  "ra0 F0 ra1 F1 I0 sg0 I1 sg1 W0 W1"};
    expect_refusal("weight-first", 2, 1, 2, weight_first,
                   "schedule \"weight-first\": rank 0, action 5 (backward-weight mb 0, virtual "
                   "stage 0 = stage 0): its backward-input has not run on this rank");
}

static void case_unmatched_send(void)
{
    /* rank 1 has nothing of micro-batch 1 */
    const char *lists[] = {fill_drain[0], "ra0 F0 B0 sg0"};
    expect_refusal("unmatched-send", 2, 1, 2, lists,
                   "schedule \"unmatched-send\": rank 0, action 3 (send activation mb 1, virtual "
                   "stage 0 = stage 0): rank 1 never receives it (no recv activation mb 1 for "
                   "stage 1)");
}

static void case_unsent_recv(void)
{
    const char *lists[] = {"F0 sa0 F1 rg0 B0 rg1 B1", fill_drain[1]};
    expect_refusal("unsent-recv", 2, 1, 2, lists,
                   "schedule \"unsent-recv\": rank 1, action 2 (recv activation mb 1, virtual "
                   "stage 0 = stage 1): no rank sends it (rank 0 has no send activation mb 1 for "
                   "stage 0)");
}

static void case_deadlock(void)
{
    /* each rank receives before it sends */
    const char *two[] = {"F0 rg0 sa0 B0", "ra0 F0 B0 sg0"};
    expect_refusal("deadlock", 2, 1, 1, two,
                   "schedule \"deadlock\": deadlock: rank 0 waits at action 1 (recv gradient mb "
                   "0, virtual stage 0 = stage 0) for rank 1, which waits at action 0 (recv "
                   "activation mb 0, virtual stage 0 = stage 1) for rank 0");
    /* rank 0 waits on a cycle it is not part of */
    const char *three[] = {"F0 sa0 rg0 B0", "ra0 F0 rg0 sa0 B0 sg0", "ra0 F0 B0 sg0"};
    expect_refusal("chain", 3, 1, 1, three,
                   "schedule \"chain\": deadlock: rank 0 waits at action 2 (recv gradient mb 0, "
                   "virtual stage 0 = stage 0) for rank 1, which waits at action 2 (recv gradient "
                   "mb 0, virtual stage 0 = stage 1) for rank 2, which waits at action 0 (recv "
                   "activation mb 0, virtual stage 0 = stage 2) for rank 1");
    /* micro-batches crossing in opposite orders on the two sides */
    const char *crossed[] = {"F0 sa0 F1 sa1 rg0 B0 rg1 B1", "ra1 F1 ra0 F0 B1 sg1 B0 sg0"};
    expect_valid("crossed", 2, 1, 2, crossed); /* sends do not block: fine */
    const char *crossed_grads[] = {"F0 sa0 rg1 F1 sa1 B1 rg0 B0", "ra0 F0 B0 sg0 ra1 F1 B1 sg1"};
    expect_refusal("crossed-grads", 2, 1, 2, crossed_grads,
                   "schedule \"crossed-grads\": deadlock: rank 0 waits at action 2 (recv gradient "
                   "mb 1, virtual stage 0 = stage 0) for rank 1, which waits at action 4 (recv "
                   "activation mb 1, virtual stage 0 = stage 1) for rank 0");
}

static void case_mixed_backward(void)
{
    const char *lists[] = {"F0 sa0 F1 sa1 rg0 B0 W0 rg1 B1", fill_drain[1]};
    expect_refusal("mixed", 2, 1, 2, lists,
                   "schedule \"mixed\": rank 0, action 6 (backward-weight mb 0, virtual stage 0 = "
                   "stage 0): mixes the split backward with a whole backward (at action 5)");
    const char *other_way[] = {"F0 sa0 F1 sa1 rg0 I0 B0 rg1 B1", fill_drain[1]};
    expect_refusal("mixed2", 2, 1, 2, other_way,
                   "schedule \"mixed2\": rank 0, action 6 (backward mb 0, virtual stage 0 = stage "
                   "0): mixes a whole backward with the split one (backward-input at action 5)");
}

static void case_ranges(void)
{
    const char *mb[] = {"F0 sa0 F2 sa1 rg0 B0 rg1 B1", fill_drain[1]};
    expect_refusal("ranges", 2, 1, 2, mb,
                   "schedule \"ranges\": rank 0, action 2 (forward mb 2, virtual stage 0 = stage "
                   "0): micro-batch 2 does not exist (the step has 0..1)");
    const char *vs[] = {"F0 sa0 F1v1 sa1 rg0 B0 rg1 B1", fill_drain[1]};
    expect_refusal("ranges", 2, 1, 2, vs,
                   "schedule \"ranges\": rank 0, action 2 (forward mb 1, virtual stage 1 = stage "
                   "2): virtual stage 1 does not exist (1 per rank)");
    const char *kind[] = {"F0 K9:0", fill_drain[1]};
    expect_refusal("ranges", 2, 1, 2, kind,
                   "schedule \"ranges\": rank 0, action 1 (kind 9 mb 0, virtual stage 0 = stage "
                   "0): unknown action kind 9 (kinds are 0..7)");
    const char *border[] = {fill_drain[0], "ra0 F0 sa0 ra1 F1 B0 sg0 B1 sg1"};
    expect_refusal("ranges", 2, 1, 2, border,
                   "schedule \"ranges\": rank 1, action 2 (send activation mb 0, virtual stage 0 "
                   "= stage 1): the last stage has no next stage to send to");
    const char *first[] = {"sg0 F0 sa0 F1 sa1 rg0 B0 rg1 B1", fill_drain[1]};
    expect_refusal("ranges", 2, 1, 2, first,
                   "schedule \"ranges\": rank 0, action 0 (send gradient mb 0, virtual stage 0 = "
                   "stage 0): stage 0 has no previous stage to send to");
    loom_schedule s;
    loom_clear_error();
    CHECK(loom_schedule_init(&s, "one", 1, 1, 1) == LOOM_OK);
    CHECK(loom_schedule_validate(&s) == LOOM_ERR_INVALID);
    CHECK_STR(loom_last_error(), "schedule \"one\": a pipeline needs 2 or more ranks (got 1)");
    loom_action a = {LOOM_ACT_FORWARD, 0, 0};
    CHECK(loom_schedule_append(&s, 1, a) == LOOM_ERR_INVALID);
    CHECK_STR(loom_last_error(), "schedule \"one\": an action for rank 1, but the pipeline has "
                                 "ranks 0..0");
    loom_schedule_free(&s);
    /* a micro-batch nobody works on: no transfer points at it */
    const char *empty[] = {"F0 sa0 rg0 B0", "ra0 F0 B0 sg0"};
    expect_refusal("empty", 2, 1, 2, empty,
                   "schedule \"empty\": rank 0, virtual stage 0 = stage 0: micro-batch 1 has no "
                   "forward");
}

static void case_describe(void)
{
    const char *virt[] = {"F0v0 sa0v0 ra0v1 F0v1 sa0v1 rg0v1 B0v1 sg0v1 rg0v0 B0v0",
                          "ra0v0 F0v0 sa0v0 ra0v1 F0v1 B0v1 sg0v1 rg0v0 B0v0 sg0v0"};
    loom_schedule s;
    make(&s, "virtual", 2, 2, 1, virt);
    char buf[160];
    loom_action_describe(&s, 1, 5, buf, sizeof buf);
    CHECK_STR(buf, "rank 1, action 5 (backward mb 0, virtual stage 1 = stage 3)");
    loom_action_describe(&s, 0, 2, buf, sizeof buf);
    CHECK_STR(buf, "rank 0, action 2 (recv activation mb 0, virtual stage 1 = stage 2)");
    CHECK_STR(loom_action_kind_name(LOOM_ACT_BACKWARD_INPUT), "backward-input");
    CHECK_STR(loom_action_kind_name(LOOM_ACT_RECV_GRADIENT), "recv gradient");
    CHECK_STR(loom_action_kind_name(42), "unknown");
    loom_schedule_free(&s);
}

/* The clocks by hand: rank 0 F [0,1], send 0.5 -> [1,1.5]; rank 1 receives
 * at 1.5, F [1.5,2.5], B [2.5,4.5], sends the gradient [4.5,4.75]; rank 0
 * receives at 4.75, B [4.75,6.75]. Busy 3 + 3 of 2 × 6.75. */
/* Two stages, one micro-batch, each rank's four actions timed: F 1, B 2,
 * an activation's send 0.5, a gradient's 0.25. */
static void make_timed(loom_schedule *s, double cost[LOOM_ACT_KIND_COUNT])
{
    const char *lists[] = {"F0 sa0 rg0 B0", "ra0 F0 B0 sg0"};
    make(s, "timed", 2, 1, 1, lists);
    CHECK(loom_schedule_validate(s) == LOOM_OK);
    for (int k = 0; k < LOOM_ACT_KIND_COUNT; k++)
        cost[k] = 0.0;
    cost[LOOM_ACT_FORWARD] = 1.0;
    cost[LOOM_ACT_BACKWARD] = 2.0;
    cost[LOOM_ACT_SEND_ACTIVATION] = 0.5;
    cost[LOOM_ACT_SEND_GRADIENT] = 0.25;
}

/* Each action's start and end on both ranks of make_timed's schedule. */
static void check_clocks(const loom_schedule_timeline *tl, const double start0[4],
                         const double end0[4], const double start1[4], const double end1[4])
{
    for (int i = 0; i < 4; i++) {
        CHECK_NEAR(tl->start[0][i], start0[i], 1e-12);
        CHECK_NEAR(tl->end[0][i], end0[i], 1e-12);
        CHECK_NEAR(tl->start[1][i], start1[i], 1e-12);
        CHECK_NEAR(tl->end[1][i], end1[i], 1e-12);
    }
}

static void case_simulate(void)
{
    loom_schedule s;
    double cost[LOOM_ACT_KIND_COUNT];
    make_timed(&s, cost);
    loom_schedule_timeline tl;
    CHECK(loom_schedule_simulate(&s, cost, &tl) == LOOM_OK);
    const double start0[] = {0, 1, 4.75, 4.75}, end0[] = {1, 1.5, 4.75, 6.75};
    const double start1[] = {1.5, 1.5, 2.5, 4.5}, end1[] = {1.5, 2.5, 4.5, 4.75};
    check_clocks(&tl, start0, end0, start1, end1);
    CHECK_NEAR(tl.makespan, 6.75, 1e-12);
    CHECK_NEAR(tl.busy[0], 3.0, 1e-12);
    CHECK_NEAR(tl.bubble, 1.0 - 6.0 / 13.5, 1e-12);
    CHECK(tl.peak_stash[0] == 1 && tl.peak_stash[1] == 1);
    loom_schedule_timeline_free(&s, &tl);
    loom_schedule_free(&s);

    /* default costs: F 1, I 1, W 1, B 2, transfers 0 */
    loom_schedule_default_costs(cost);
    CHECK(cost[LOOM_ACT_FORWARD] == 1.0 && cost[LOOM_ACT_BACKWARD] == 2.0 &&
          cost[LOOM_ACT_BACKWARD_INPUT] == 1.0 && cost[LOOM_ACT_BACKWARD_WEIGHT] == 1.0 &&
          cost[LOOM_ACT_SEND_ACTIVATION] == 0.0 && cost[LOOM_ACT_RECV_GRADIENT] == 0.0);
    /* The stash counts until the weight half: W's held back keep the
     * micro-batches alive. */
    const char *late_w[] = {"F0 sa0 F1 sa1 rg0 I0 rg1 I1 W0 W1", "ra0 F0 I0 sg0 ra1 F1 I1 sg1 W0 W1"};
    make(&s, "late-w", 2, 1, 2, late_w);
    CHECK(loom_schedule_validate(&s) == LOOM_OK);
    CHECK(loom_schedule_simulate(&s, cost, &tl) == LOOM_OK);
    CHECK(tl.peak_stash[0] == 2 && tl.peak_stash[1] == 2);
    /* rank 1: F0 [1,2], I0 [2,3], F1 [3,4], I1 [4,5], W0 W1 [5,7];
     * rank 0: F0 F1 [0,2], I0 [3,4], I1 [5,6], W0 W1 [6,8] */
    CHECK_NEAR(tl.makespan, 8.0, 1e-12);
    loom_schedule_timeline_free(&s, &tl);
    loom_schedule_free(&s);
}

/* Transfer latency: a receive waits for its send's end + X; the send's
 * own cost still holds its rank, the latency does not. */
static void case_transfers(void)
{
    loom_schedule s;
    double cost[LOOM_ACT_KIND_COUNT];
    make_timed(&s, cost);
    loom_schedule_timeline tl;
    CHECK(loom_schedule_simulate_transfers(&s, cost, 1.0, &tl) == LOOM_OK);
    /* rank 0: F0 [0,1], sa0 [1,1.5]; rank 1: ra0 arrives 2.5, F0 [2.5,3.5],
     * B0 [3.5,5.5], sg0 [5.5,5.75]; rank 0: rg0 arrives 6.75, B0 [6.75,8.75] */
    const double start0[] = {0, 1, 6.75, 6.75}, end0[] = {1, 1.5, 6.75, 8.75};
    const double start1[] = {2.5, 2.5, 3.5, 5.5}, end1[] = {2.5, 3.5, 5.5, 5.75};
    check_clocks(&tl, start0, end0, start1, end1);
    CHECK_NEAR(tl.arrival[1][0], 2.5, 1e-12);
    CHECK_NEAR(tl.arrival[0][2], 6.75, 1e-12);
    CHECK(tl.arrival[0][0] == 0.0 && tl.arrival[1][3] == 0.0);
    CHECK_NEAR(tl.makespan, 8.75, 1e-12); /* 6.75 without latency, + 2 transfers */
    CHECK(tl.transfer == 1.0);
    CHECK_NEAR(tl.bubble, 1.0 - 6.0 / 17.5, 1e-12);
    loom_schedule_timeline_free(&s, &tl);
    /* 0 is loom_schedule_simulate, to the bit */
    loom_schedule_timeline free_tl;
    CHECK(loom_schedule_simulate_transfers(&s, cost, 0.0, &tl) == LOOM_OK);
    CHECK(loom_schedule_simulate(&s, cost, &free_tl) == LOOM_OK);
    CHECK(tl.makespan == free_tl.makespan && tl.bubble == free_tl.bubble);
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 4; i++)
            CHECK(tl.start[r][i] == free_tl.start[r][i] && tl.end[r][i] == free_tl.end[r][i]);
    loom_schedule_timeline_free(&s, &tl);
    loom_schedule_timeline_free(&s, &free_tl);
    /* a negative or NaN latency is refused */
    CHECK(loom_schedule_simulate_transfers(&s, cost, -1.0, &tl) == LOOM_ERR_INVALID);
    CHECK_STR(loom_last_error(), "schedule \"timed\": transfer time -1: give 0 or more");
    CHECK(loom_schedule_simulate_transfers(&s, cost, NAN, &tl) == LOOM_ERR_INVALID);
    loom_schedule_free(&s);
}

/* ------------------------------------------------------ shipped schedules */

typedef struct schedule_source {
    loom_config *cfg;
    loom_runtime *rt;
} schedule_source;

static void source_open(schedule_source *src)
{
    if (loom_config_parse("", "schedule_test", NULL, 0, &src->cfg) != LOOM_OK ||
        loom_runtime_create(src->cfg, &src->rt) != LOOM_OK) {
        fprintf(stderr, "schedule_test: %s\n", loom_last_error());
        exit(2);
    }
}

static void source_close(schedule_source *src)
{
    loom_runtime_destroy(src->rt);
    loom_config_free(src->cfg);
}

/* The plugin's schedule for p, v, m; LOOM_OK or its refusal. */
static int build(schedule_source *src, const char *name, int p, int v, int m, loom_schedule *out)
{
    const loom_plugin *plugin;
    const loom_host *host;
    int rc = loom_runtime_plugin(src->rt, LOOM_PLUGIN_SCHEDULE, name, &plugin);
    if (rc == LOOM_OK)
        rc = loom_runtime_host(src->rt, plugin, "parallel.pp", &host);
    if (rc != LOOM_OK) {
        fprintf(stderr, "schedule_test: %s\n", loom_last_error());
        exit(2);
    }
    CHECK(plugin->kind == LOOM_PLUGIN_SCHEDULE);
    return loom_schedule_build(plugin, host, p, v, m, out);
}

static void count_kinds(const loom_schedule *s, int r, int counts[LOOM_ACT_KIND_COUNT])
{
    memset(counts, 0, LOOM_ACT_KIND_COUNT * sizeof(int));
    for (int i = 0; i < s->count[r]; i++)
        counts[s->actions[r][i].kind]++;
}

static void case_shipped(void)
{
    schedule_source src;
    source_open(&src);
    const char *names[] = {"gpipe", "1f1b", "interleaved", "zb-h1", filldrain_path};
    for (size_t n = 0; n < LOOM_ARRAY_LEN(names); n++) {
        if (!names[n])
            continue;
        int v = !strcmp(names[n], "interleaved") ? 2 : 1;
        int split = !strcmp(names[n], "zb-h1");
        for (int p = 2; p <= 4; p++)
            for (int k = 1; k <= 4; k *= 2) {
                int m = k * p;
                loom_schedule s;
                int rc = build(&src, names[n], p, v, m, &s);
                if (rc != LOOM_OK)
                    fprintf(stderr, "%s p=%d m=%d: %s\n", names[n], p, m, loom_last_error());
                CHECK(rc == LOOM_OK);
                if (rc != LOOM_OK)
                    continue;
                /* what every rank's list must hold, counted independently
                 * of the validator */
                for (int r = 0; r < p; r++) {
                    int c[LOOM_ACT_KIND_COUNT];
                    count_kinds(&s, r, c);
                    int first = r == 0, last = r == p - 1; /* of vs 0 / vs v-1 */
                    CHECK(c[LOOM_ACT_FORWARD] == v * m);
                    CHECK(c[split ? LOOM_ACT_BACKWARD_INPUT : LOOM_ACT_BACKWARD] == v * m);
                    CHECK(c[LOOM_ACT_BACKWARD_WEIGHT] == (split ? v * m : 0));
                    CHECK(c[split ? LOOM_ACT_BACKWARD : LOOM_ACT_BACKWARD_INPUT] == 0);
                    CHECK(c[LOOM_ACT_RECV_ACTIVATION] == (v - first) * m);
                    CHECK(c[LOOM_ACT_SEND_GRADIENT] == (v - first) * m);
                    CHECK(c[LOOM_ACT_SEND_ACTIVATION] == (v - last) * m);
                    CHECK(c[LOOM_ACT_RECV_GRADIENT] == (v - last) * m);
                }
                loom_schedule_free(&s);
            }
    }
    /* refusals of the plugins, as the trainer and `loom schedule` show them */
    loom_schedule s;
    CHECK(build(&src, "interleaved", 2, 2, 3, &s) == LOOM_ERR_INVALID);
    CHECK_STR(loom_last_error(), "interleaved: parallel.pp.microbatches = 3 is not a multiple of "
                                 "parallel.pp.size = 2 (micro-batches go through the virtual "
                                 "stages in groups of 2); use 2 or 4");
    CHECK(build(&src, "interleaved", 2, 1, 4, &s) == LOOM_ERR_INVALID);
    CHECK_STR(loom_last_error(), "interleaved: needs parallel.pp.virtual_stages of 2 or more (got "
                                 "1); with one, use the 1f1b schedule");
    CHECK(build(&src, "1f1b", 2, 2, 4, &s) == LOOM_ERR_INVALID);
    CHECK_STR(loom_last_error(), "1f1b: one virtual stage per rank only (parallel.pp."
                                 "virtual_stages = 2); the interleaved schedule takes more");
    /* gpipe also takes virtual stages */
    CHECK(build(&src, "gpipe", 2, 2, 4, &s) == LOOM_OK);
    loom_schedule_free(&s);
    /* m < p: short warm-ups */
    for (int p = 3; p <= 4; p++)
        for (int m = 1; m < p; m++) {
            const char *short_names[] = {"gpipe", "1f1b", "zb-h1"};
            for (int n = 0; n < 3; n++) {
                int rc = build(&src, short_names[n], p, 1, m, &s);
                if (rc != LOOM_OK)
                    fprintf(stderr, "%s p=%d m=%d: %s\n", short_names[n], p, m, loom_last_error());
                CHECK(rc == LOOM_OK);
                if (rc == LOOM_OK)
                    loom_schedule_free(&s);
            }
        }
    source_close(&src);
}

/* Simulated with the default costs (F 1, B 2 = I 1 + W 1). */
static void simulate_plugin(schedule_source *src, const char *name, int p, int v, int m,
                            loom_schedule *s, loom_schedule_timeline *tl)
{
    double cost[LOOM_ACT_KIND_COUNT];
    loom_schedule_default_costs(cost);
    int rc = build(src, name, p, v, m, s);
    if (rc == LOOM_OK)
        rc = loom_schedule_simulate(s, cost, tl);
    if (rc != LOOM_OK) {
        fprintf(stderr, "schedule_test: %s p=%d m=%d: %s\n", name, p, m, loom_last_error());
        exit(2);
    }
}

static void case_bubble(void)
{
    schedule_source src;
    source_open(&src);
    printf("%-12s %2s %2s %3s %9s %9s %11s\n", "schedule", "p", "v", "m", "makespan", "bubble",
           "theory");
    for (int p = 2; p <= 4; p++)
        for (int k = 1; k <= 4; k *= 2) {
            int m = k * p;
            loom_schedule s;
            loom_schedule_timeline tl;
            double bubble_1f1b = 0.0;
            /* GPipe and 1F1B idle (p−1)(F+B) per rank: (p−1)/(m+p−1). */
            const char *flat[] = {"gpipe", "1f1b"};
            for (int n = 0; n < 2; n++) {
                simulate_plugin(&src, flat[n], p, 1, m, &s, &tl);
                double theory = (double)(p - 1) / (m + p - 1);
                printf("%-12s %2d %2d %3d %9g %9.6f %11.6f\n", flat[n], p, 1, m, tl.makespan,
                       tl.bubble, theory);
                CHECK_NEAR(tl.bubble, theory, 1e-9);
                CHECK_NEAR(tl.makespan, 3.0 * (m + p - 1), 1e-9);
                bubble_1f1b = tl.bubble;
                loom_schedule_timeline_free(&s, &tl);
                loom_schedule_free(&s);
            }
            /* Interleaved with v = 2: Megatron's (p−1)/(v·m+p−1), below 1F1B. */
            simulate_plugin(&src, "interleaved", p, 2, m, &s, &tl);
            double theory = (double)(p - 1) / (2.0 * m + p - 1);
            printf("%-12s %2d %2d %3d %9g %9.6f %11.6f\n", "interleaved", p, 2, m, tl.makespan,
                   tl.bubble, theory);
            CHECK(tl.bubble < bubble_1f1b);
            CHECK_NEAR(tl.bubble, theory, 1e-9);
            loom_schedule_timeline_free(&s, &tl);
            loom_schedule_free(&s);
        }
    source_close(&src);
}

/* The issue asks for zb-h1's bubble at "about a third of 1f1b's" with equal
 * F, B and W costs. A third is the idle *time*: per rank 1F1B idles
 * (p−1)(F+B+W) = 3(p−1) units, ZB-H1 (p−1)(F+B−W) = p−1. The bubble
 * *fraction* divides by the makespan too, which shrinks with ZB-H1
 * (3m+p−1 against 3(m+p−1)), so the ratio of fractions is
 * (m+p−1)/(3m+p−1): 0.41 at p = 4, m = 8, tending to a third as m grows.
 * The test checks the idle time exactly and the fraction ratio against
 * one half, as the brief asks, and prints both ratios. */
static void case_zero_bubble(void)
{
    schedule_source src;
    source_open(&src);
    printf("%2s %3s %12s %12s %14s %12s\n", "p", "m", "bubble 1f1b", "bubble zb-h1",
           "fraction ratio", "idle ratio");
    for (int p = 2; p <= 4; p++)
        for (int k = 1; k <= 4; k *= 2) {
            int m = k * p;
            loom_schedule s;
            loom_schedule_timeline tl;
            simulate_plugin(&src, "1f1b", p, 1, m, &s, &tl);
            double bubble_1f1b = tl.bubble, idle_1f1b = tl.makespan - tl.busy[0];
            loom_schedule_timeline_free(&s, &tl);
            loom_schedule_free(&s);
            simulate_plugin(&src, "zb-h1", p, 1, m, &s, &tl);
            double idle_zb = tl.makespan - tl.busy[0];
            printf("%2d %3d %12.6f %12.6f %14.4f %12.4f\n", p, m, bubble_1f1b, tl.bubble,
                   tl.bubble / bubble_1f1b, idle_zb / idle_1f1b);
            CHECK(tl.bubble <= 0.5 * bubble_1f1b);
            CHECK_NEAR(tl.makespan, 3.0 * m + p - 1, 1e-9);
            for (int r = 0; r < p; r++)
                CHECK_NEAR(tl.makespan - tl.busy[r], (double)(p - 1), 1e-9);
            CHECK_NEAR(idle_zb / idle_1f1b, 1.0 / 3.0, 1e-9);
            loom_schedule_timeline_free(&s, &tl);
            loom_schedule_free(&s);
        }
    source_close(&src);
}

/* Micro-batches alive at once (forward run, backward or backward-weight
 * not yet): 1F1B keeps p − r on rank r (at most m), GPipe all m, ZB-H1 p
 * on every rank (1F1B's peak, on rank 0). */
static void case_stash(void)
{
    schedule_source src;
    source_open(&src);
    for (int p = 2; p <= 4; p++)
        for (int m = 1; m <= 4 * p; m++) {
            loom_schedule s;
            loom_schedule_timeline tl;
            simulate_plugin(&src, "1f1b", p, 1, m, &s, &tl);
            for (int r = 0; r < p; r++)
                CHECK(tl.peak_stash[r] == (p - r < m ? p - r : m));
            CHECK(tl.peak_stash[0] == (p < m ? p : m));
            loom_schedule_timeline_free(&s, &tl);
            loom_schedule_free(&s);
            simulate_plugin(&src, "gpipe", p, 1, m, &s, &tl);
            for (int r = 0; r < p; r++)
                CHECK(tl.peak_stash[r] == m);
            loom_schedule_timeline_free(&s, &tl);
            loom_schedule_free(&s);
            simulate_plugin(&src, "zb-h1", p, 1, m, &s, &tl);
            for (int r = 0; r < p; r++)
                CHECK(tl.peak_stash[r] == (p < m ? p : m));
            loom_schedule_timeline_free(&s, &tl);
            loom_schedule_free(&s);
        }
    source_close(&src);
}

/* Every compute action one rect of its class, idle rects where ranks wait. */
static void case_svg(void)
{
    schedule_source src;
    source_open(&src);
    loom_schedule s;
    loom_schedule_timeline tl;
    simulate_plugin(&src, "zb-h1", 4, 1, 8, &s, &tl);
    char path[] = "/tmp/loom-schedule-XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    CHECK(f != NULL);
    if (f) {
        CHECK(loom_schedule_svg(&s, &tl, f) == LOOM_OK);
        fclose(f);
        FILE *in = fopen(path, "r");
        char line[4096];
        int forward = 0, input = 0, weight = 0, whole = 0, idle = 0, title = 0;
        while (in && fgets(line, sizeof line, in)) {
            forward += strstr(line, "<rect class=\"forward\"") != NULL;
            input += strstr(line, "<rect class=\"backward-input\"") != NULL;
            weight += strstr(line, "<rect class=\"backward-weight\"") != NULL;
            whole += strstr(line, "<rect class=\"backward\"") != NULL;
            idle += strstr(line, "<rect class=\"idle\"") != NULL;
            title += strstr(line, "zb-h1: p = 4, v = 1, m = 8, bubble 11.1%") != NULL;
        }
        if (in)
            fclose(in);
        CHECK(forward == 32 && input == 32 && weight == 32 && whole == 0);
        /* each rank idles once, in the warm-up: ranks 1..3 before their
         * first forward and rank 0 too before its first B; ranks 1-3 also
         * wait between warm-up forwards and the first B */
        CHECK(idle >= 4);
        CHECK(title == 1);
        remove(path);
    }
    loom_schedule_timeline_free(&s, &tl);
    loom_schedule_free(&s);
    source_close(&src);
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*run)(void);
    } cases[] = {{"valid", case_valid},
                 {"missing_backward", case_missing_backward},
                 {"duplicate_forward", case_duplicate_forward},
                 {"backward_before_forward", case_backward_before_forward},
                 {"unmatched_send", case_unmatched_send},
                 {"unsent_recv", case_unsent_recv},
                 {"deadlock", case_deadlock},
                 {"mixed_backward", case_mixed_backward},
                 {"ranges", case_ranges},
                 {"describe", case_describe},
                 {"simulate", case_simulate},
                 {"transfers", case_transfers},
                 {"shipped", case_shipped},
                 {"bubble", case_bubble},
                 {"zero_bubble", case_zero_bubble},
                 {"stash", case_stash},
                 {"svg", case_svg}};
    if (argc < 2) {
        fprintf(stderr, "usage: schedule_test CASE [FILLDRAIN_SO]\n");
        return 2;
    }
    filldrain_path = argc > 2 ? argv[2] : NULL;
    int found = 0;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(cases); i++)
        if (!strcmp(argv[1], "all") || !strcmp(argv[1], cases[i].name)) {
            cases[i].run();
            found = 1;
        }
    if (!found) {
        fprintf(stderr, "schedule_test: no case '%s'\n", argv[1]);
        return 2;
    }
    return check_done("schedule_test");
}
