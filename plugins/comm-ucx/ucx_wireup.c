/* comm-ucx — the process's UCX state and the communicators on it.
 *
 * One UCP context and one worker per process, whatever the number of
 * communicators: the first create_world makes them, the last destroy tears
 * them down. Each rank publishes its worker address in the bootstrap store
 * (with its pid and host, so a local peer that dies is noticed without UCX's
 * help) and makes an endpoint to every rank of the world, itself included
 * (send/recv to oneself goes through UCX's self transport), then warms
 * the shared memory to the ranks on its host (warm_shared_memory). A subgroup
 * reuses those endpoints and needs only a fresh id from the store.
 *
 * Communicator ids: the store's counter "uid" hands out one number per
 * communicator; it separates their tags (ucx_sched.c) and names their keys.
 *
 * Failed peers. UCX's own peer-failure reporting (UCP_ERR_HANDLING_MODE_PEER)
 * is available as comm.ucx.peer_errors, off by default: in UCX 1.13 it
 * excludes the shared-memory and cma transports, so ranks on one host fall
 * back to TCP at a tenth of the bandwidth. Without it, a wait that is not
 * done after a while checks whether the peers it waits for still exist
 * (local peers by pid; remote ones are caught by the timeout). */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ucs/debug/log_def.h>

#include "common/clock.h"
#include "ucx_internal.h"

ucx_proc ucx = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .work = PTHREAD_COND_INITIALIZER,
    .efd = -1,
};

/* ------------------------------------------------------- peer liveness */

/* What makes a pid meaningful to another process: same host, same pid
 * namespace. */
static void locality_key(char *buf, size_t cap)
{
    char host[128] = "?", ns[64] = "";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
    ns[n > 0 ? n : 0] = '\0';
    snprintf(buf, cap, "%s|%s", host, ns);
}

int ucx_peer_dead(int w, char *why, size_t cap)
{
    if (w < 0 || w >= ucx.world_size || !ucx.peers)
        return 0;
    ucx_peer *p = &ucx.peers[w];
    if (p->failed) {
        snprintf(why, cap, "its UCX endpoint failed: %s", ucs_status_string(p->status));
        return 1;
    }
    if (!p->local || p->pid <= 0 || w == ucx.world_rank)
        return 0;
    if (!p->gone) {
        if (kill(p->pid, 0) != 0 && errno == ESRCH) {
            p->gone = 1;
        } else {
            /* an exited child its launcher has not reaped yet */
            char path[64], stat[256];
            snprintf(path, sizeof path, "/proc/%d/stat", p->pid);
            FILE *f = fopen(path, "r");
            if (f) {
                size_t len = fread(stat, 1, sizeof stat - 1, f);
                fclose(f);
                stat[len] = '\0';
                const char *close = strrchr(stat, ')');
                if (close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X'))
                    p->gone = 1;
            }
        }
    }
    if (p->gone)
        snprintf(why, cap, "its process (pid %d on this host) has exited", p->pid);
    return p->gone;
}

static void ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    int w = (int)(intptr_t)arg;
    /* Called from inside ucp_worker_progress, so with ucx.lock held. */
    if (w >= 0 && w < ucx.world_size && ucx.peers && !ucx.peers[w].failed) {
        ucx.peers[w].failed = 1;
        ucx.peers[w].status = status;
    }
}

/* ---------------------------------------------------------- the process */

typedef struct addr_blob {
    uint32_t magic;
    int32_t pid;
    char locality[192];
    uint32_t len;
    /* the worker address follows */
} addr_blob;

#define ADDR_MAGIC 0x6c75637831ull /* "lucx1" */

static void progress_stop(void);

static void *progress_main(void *arg);

static int warm_shared_memory(const loom_host *host, const ucx_settings *s);

/* UCX 1.13 cannot take back a send to a peer that stopped or died: a
 * rendezvous send waits for the peer's reply forever, ucp_request_cancel
 * takes back receives only, and without peer error handling (off by
 * default, comm.ucx.peer_errors) UCX does not track the request, so not even
 * a forced endpoint close completes it. ucp_worker_destroy then warns that
 * it "was not returned to mpool ucp_requests"; with peer error handling the
 * forced close's own flush to the stopped peer never ends either, and it
 * warns that "callbacks remain in the queue". Both name UCX objects a user
 * can do nothing about, for the failure loom has already reported. Only
 * these two warnings, only while the worker of a failed job goes away, are
 * counted instead of shown. */
static unsigned leftovers_of_dead_peers;

static int is_warning(const char *file, ucs_log_level_t level, const char *source_file,
                      const char *message, const char *text)
{
    const char *base = strrchr(file, '/');
    return level == UCS_LOG_LEVEL_WARN && !strcmp(base ? base + 1 : file, source_file) &&
           strstr(message, text);
}

static ucs_log_func_rc_t drop_leftover_warnings(const char *file, unsigned line,
                                                const char *function, ucs_log_level_t level,
                                                const ucs_log_component_config_t *comp_conf,
                                                const char *message, va_list ap)
{
    (void)line, (void)function, (void)comp_conf, (void)ap;
    if (is_warning(file, level, "mpool.c", message, "was not returned to mpool") ||
        is_warning(file, level, "callbackq.c", message, "callbacks remain in the queue")) {
        leftovers_of_dead_peers++;
        return UCS_LOG_FUNC_RC_STOP;
    }
    return UCS_LOG_FUNC_RC_CONTINUE;
}

static void worker_destroy(const loom_host *host)
{
    if (!ucx.failed) {
        ucp_worker_destroy(ucx.worker);
        return;
    }
    leftovers_of_dead_peers = 0;
    ucs_log_push_handler(drop_leftover_warnings);
    ucp_worker_destroy(ucx.worker);
    ucs_log_pop_handler();
    if (leftovers_of_dead_peers)
        host->log(host, LOOM_LOG_DEBUG,
                  "UCX still held %u request(s) or callback(s) for ranks that stopped or died; "
                  "its warnings about them at teardown are not shown",
                  leftovers_of_dead_peers);
}

static void process_teardown(const loom_host *host)
{
    progress_stop();
    double limit = ucx.timeout_s < 5 ? ucx.timeout_s : 5;
    if (ucx.worker && !ucx.failed) {
        /* Deliver what we sent before the endpoints go: a peer may still be
         * waiting for our last eager message or rendezvous reply. */
        ucp_request_param_t prm = {0};
        ucs_status_ptr_t fr = ucp_worker_flush_nbx(ucx.worker, &prm);
        double t0 = clock_now_s();
        if (UCS_PTR_IS_PTR(fr)) {
            while (ucp_request_check_status(fr) == UCS_INPROGRESS && clock_now_s() - t0 < limit) {
                if (!ucp_worker_progress(ucx.worker))
                    sched_yield();
            }
            if (ucp_request_check_status(fr) == UCS_INPROGRESS)
                host->log(host, LOOM_LOG_WARN, "comm-ucx: flushing UCX did not finish in %.1f s",
                          limit);
            ucp_request_free(fr);
        }
    }
    if (ucx.peers) {
        void **closing = calloc((size_t)ucx.world_size, sizeof *closing);
        for (int w = 0; w < ucx.world_size; w++) {
            if (!ucx.peers[w].ep)
                continue;
            ucp_request_param_t prm = {0};
            prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
            prm.flags = ucx.failed || ucx.peers[w].failed ? UCP_EP_CLOSE_FLAG_FORCE : 0;
            ucs_status_ptr_t cr = ucp_ep_close_nbx(ucx.peers[w].ep, &prm);
            if (UCS_PTR_IS_PTR(cr)) {
                if (closing)
                    closing[w] = cr;
                else
                    ucp_request_free(cr);
            }
            ucx.peers[w].ep = NULL;
        }
        double t0 = clock_now_s();
        for (int w = 0; closing && w < ucx.world_size; w++) {
            while (closing[w] && ucp_request_check_status(closing[w]) == UCS_INPROGRESS &&
                   clock_now_s() - t0 < limit) {
                if (!ucp_worker_progress(ucx.worker))
                    sched_yield();
            }
            if (closing[w])
                ucp_request_free(closing[w]);
        }
        free(closing);
        free(ucx.peers);
        ucx.peers = NULL;
    }
    if (ucx.worker)
        worker_destroy(host);
    ucx.efd = -1;
    if (ucx.ctx)
        ucp_cleanup(ucx.ctx);
    ucx.worker = NULL;
    ucx.ctx = NULL;
    scratch_release_all();
    sched_pool_release();
    ucx.failed = 0;
}

/* Make the context, the worker and an endpoint to every world rank.
 * Called with ucx.lock held, on every rank at its first create_world. */
static int process_start(const loom_host *host, const ucx_settings *s)
{
    int n = host->world_size, me = host->rank, gen = ucx.generation++;
    ucp_config_t *cfg = NULL;
    ucs_status_t us = ucp_config_read(NULL, NULL, &cfg);
    if (us != UCS_OK)
        return host->error(host, LOOM_ERR_INTERNAL, "comm-ucx: reading UCX's configuration: %s",
                           ucs_status_string(us));
    if (s->tls && *s->tls && (us = ucp_config_modify(cfg, "TLS", s->tls)) != UCS_OK) {
        ucp_config_release(cfg);
        return host->error(host, LOOM_ERR_INVALID, "comm-ucx: comm.ucx.tls = \"%s\": UCX refuses it: %s",
                           s->tls, ucs_status_string(us));
    }
    ucp_params_t prm = {0};
    prm.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS |
                     UCP_PARAM_FIELD_ESTIMATED_NUM_PPN;
    /* WAKEUP: idle waits sleep on the worker's event fd (it keeps the
     * shared-memory and cma transports, unlike peer error handling). */
    prm.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    prm.estimated_num_eps = (size_t)n;
    prm.estimated_num_ppn = (size_t)(host->local_size > 0 ? host->local_size : 1);
    us = ucp_init(&prm, cfg, &ucx.ctx);
    ucp_config_release(cfg);
    if (us != UCS_OK) {
        ucx.ctx = NULL;
        if (s->tls && *s->tls)
            return host->error(host, LOOM_ERR_INVALID,
                               "comm-ucx: ucp_init failed: %s: comm.ucx.tls = \"%s\" leaves UCX no "
                               "usable transport (see `ucx_info -d`; \"\" lets UCX choose)",
                               ucs_status_string(us), s->tls);
        return host->error(host, LOOM_ERR_INTERNAL, "comm-ucx: ucp_init failed: %s (see `ucx_info -d`)",
                           ucs_status_string(us));
    }
    ucp_worker_params_t wp = {0};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = s->progress_thread ? UCS_THREAD_MODE_MULTI : UCS_THREAD_MODE_SERIALIZED;
    if ((us = ucp_worker_create(ucx.ctx, &wp, &ucx.worker)) != UCS_OK) {
        ucx.worker = NULL;
        process_teardown(host);
        return host->error(host, LOOM_ERR_INTERNAL, "comm-ucx: ucp_worker_create failed: %s",
                           ucs_status_string(us));
    }
    ucx.world_size = n;
    ucx.world_rank = me;
    ucx.timeout_s = s->timeout_s;
    ucx.own_core = ucx_own_core(host);
    ucx.spin_us = s->spin_us; /* the progress thread shares the caller's core */
    if (ucp_worker_get_efd(ucx.worker, &ucx.efd) != UCS_OK)
        ucx.efd = -1;
    ucx.peers = calloc((size_t)n, sizeof *ucx.peers);
    if (!ucx.peers) {
        process_teardown(host);
        return host->error(host, LOOM_ERR_NO_MEMORY, "comm-ucx: out of memory");
    }

    /* publish our address */
    ucp_address_t *addr = NULL;
    size_t alen = 0;
    if ((us = ucp_worker_get_address(ucx.worker, &addr, &alen)) != UCS_OK) {
        process_teardown(host);
        return host->error(host, LOOM_ERR_INTERNAL, "comm-ucx: ucp_worker_get_address failed: %s",
                           ucs_status_string(us));
    }
    size_t cap = sizeof(addr_blob) + alen;
    addr_blob *mine = calloc(1, cap);
    if (!mine) {
        ucp_worker_release_address(ucx.worker, addr);
        process_teardown(host);
        return host->error(host, LOOM_ERR_NO_MEMORY, "comm-ucx: out of memory");
    }
    mine->magic = (uint32_t)ADDR_MAGIC;
    mine->pid = (int32_t)getpid();
    locality_key(mine->locality, sizeof mine->locality);
    mine->len = (uint32_t)alen;
    memcpy(mine + 1, addr, alen);
    ucp_worker_release_address(ucx.worker, addr);
    char key[96];
    snprintf(key, sizeof key, "addr/%d/%d", gen, me);
    int st = host->kv_put(host, key, mine, cap);
    if (st != LOOM_OK) {
        free(mine);
        process_teardown(host);
        return st;
    }

    /* fetch every address (ours too: the self endpoint) and connect */
    size_t bcap = 65536;
    addr_blob *theirs = malloc(bcap);
    if (!theirs) {
        free(mine);
        process_teardown(host);
        return host->error(host, LOOM_ERR_NO_MEMORY, "comm-ucx: out of memory");
    }
    for (int w = 0; w < n && st == LOOM_OK; w++) {
        size_t len = 0;
        snprintf(key, sizeof key, "addr/%d/%d", gen, w);
        st = host->kv_get(host, key, theirs, bcap, &len, s->timeout_s);
        if (st != LOOM_OK) {
            st = host->error(host, st,
                             "comm-ucx: rank %d did not publish its UCX address within %.1f s "
                             "(is it running, with the same comm backend \"ucx\"?)",
                             w, s->timeout_s);
            break;
        }
        if (len < sizeof(addr_blob) || len > bcap || theirs->magic != (uint32_t)ADDR_MAGIC ||
            sizeof(addr_blob) + theirs->len != len) {
            st = host->error(host, LOOM_ERR_INVALID,
                             "comm-ucx: rank %d published a malformed UCX address (%zu bytes); "
                             "do all ranks run the same loom?", w, len);
            break;
        }
        ucp_ep_params_t ep = {0};
        ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.address = (const ucp_address_t *)(theirs + 1);
        ep.err_mode = s->peer_errors ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
        ep.err_handler.cb = ep_error;
        ep.err_handler.arg = (void *)(intptr_t)w;
        if ((us = ucp_ep_create(ucx.worker, &ep, &ucx.peers[w].ep)) != UCS_OK) {
            ucx.peers[w].ep = NULL;
            st = host->error(host, LOOM_ERR_REMOTE,
                             "comm-ucx: cannot reach rank %d over UCX: %s (check comm.ucx.tls "
                             "and UCX_TLS / UCX_NET_DEVICES)",
                             w, ucs_status_string(us));
            break;
        }
        ucx.peers[w].pid = theirs->pid;
        ucx.peers[w].local = strcmp(theirs->locality, mine->locality) == 0;
    }
    free(theirs);
    free(mine);
    if (st != LOOM_OK) {
        ucx.failed = 1;
        process_teardown(host);
        return st;
    }
    if ((st = warm_shared_memory(host, s)) != LOOM_OK) {
        ucx.failed = 1;
        process_teardown(host);
        return st;
    }
    if (s->progress_thread) {
        ucx.thread_stop = 0;
        if (pthread_create(&ucx.thread, NULL, progress_main, NULL) != 0) {
            process_teardown(host);
            return host->error(host, LOOM_ERR_INTERNAL, "comm-ucx: cannot start the progress thread");
        }
        ucx.thread_on = 1;
    }
    host->log(host, LOOM_LOG_DEBUG, "comm-ucx: UCX %s up, %d endpoints%s; %s: waits spin %.0f us",
              ucp_get_version_string(), n, s->progress_thread ? ", progress thread" : "",
              ucx.own_core ? "a core of its own" : "cores shared with other ranks", ucx_spin_us(s));
    return LOOM_OK;
}

/* ------------------------------------------------- warming shared memory */

/* UCX's shared-memory transports pass a message past their inline size
 * (about 100 bytes) through 8 KiB receive descriptors, and the first time
 * a process writes or reads each one it takes page faults: here the first
 * ~100 such messages to a rank cost 3-8 us each instead of 0.7, so a
 * job's first collectives of 96 B-8 KiB (or a benchmark's first sizes)
 * ran 5x slower than the rest. Each rank sends WARM_MESSAGES of them to
 * every rank on its host, in rounds (round k: to the k-th local rank after
 * it, from the k-th before), all sent before it posts its receives, so
 * most arrive unexpected, as a collective's often do: twice the 64-element
 * FIFO UCX's sysv and posix transports have by default. */
enum { WARM_MESSAGES = 128, WARM_BYTES = 4096 };
#define WARM_TAG (~0ull) /* received before this rank's first communicator exists */

static int warm_round(const loom_host *host, const ucx_settings *s, int to, int from, char *buf)
{
    static const ucp_request_param_t plain = {0};
    ucs_status_ptr_t req[2 * WARM_MESSAGES]; /* the sends to `to`, then the receives from `from` */
    for (int i = 0; i < WARM_MESSAGES; i++)
        req[i] = ucp_tag_send_nbx(ucx.peers[to].ep, buf, WARM_BYTES, WARM_TAG, &plain);
    for (int i = WARM_MESSAGES; i < 2 * WARM_MESSAGES; i++)
        req[i] = ucp_tag_recv_nbx(ucx.worker, buf + WARM_BYTES, WARM_BYTES, WARM_TAG, ~0ull,
                                  &plain);
    double t0 = clock_now_s(), next_check = 1;
    int st = LOOM_OK;
    for (int i = 0; i < 2 * WARM_MESSAGES && st == LOOM_OK;) {
        int sending = i < WARM_MESSAGES, peer = sending ? to : from;
        if (UCS_PTR_IS_ERR(req[i])) {
            st = host->error(host, LOOM_ERR_REMOTE,
                             "comm-ucx: warming shared memory with rank %d: %s", peer,
                             ucs_status_string(UCS_PTR_STATUS(req[i])));
        } else if (req[i] == NULL || ucp_request_check_status(req[i]) != UCS_INPROGRESS) {
            i++;
        } else if (!ucp_worker_progress(ucx.worker)) {
            double waited = clock_now_s() - t0;
            char why[256];
            if (waited > next_check) {
                next_check = waited + 0.1;
                if (ucx_peer_dead(peer, why, sizeof why))
                    st = host->error(host, LOOM_ERR_REMOTE, "comm-ucx: rank %d %s", peer, why);
            }
            if (st == LOOM_OK && waited > s->timeout_s)
                st = host->error(host, LOOM_ERR_TIMEOUT,
                                 "comm-ucx: rank %d did not %s its warm-up messages %s rank %d "
                                 "within %.1f s at start (is it running?)",
                                 peer, sending ? "take" : "send", sending ? "from" : "to",
                                 host->rank, s->timeout_s);
            sched_yield();
        }
    }
    for (int i = 0; i < 2 * WARM_MESSAGES; i++)
        if (req[i] && !UCS_PTR_IS_ERR(req[i])) {
            if (ucp_request_check_status(req[i]) == UCS_INPROGRESS)
                ucp_request_cancel(ucx.worker, req[i]); /* a receive; sends end by themselves */
            ucp_request_free(req[i]);
        }
    return st;
}

static int warm_shared_memory(const loom_host *host, const ucx_settings *s)
{
    int n = host->world_size, me = host->rank, nlocal = 0, mine = 0;
    int *local = malloc((size_t)n * sizeof *local);
    char *buf = calloc(2, WARM_BYTES);
    int st = local && buf ? LOOM_OK
                          : host->error(host, LOOM_ERR_NO_MEMORY, "comm-ucx: out of memory");
    for (int w = 0; w < n && st == LOOM_OK; w++)
        if (w == me || ucx.peers[w].local) {
            if (w == me)
                mine = nlocal;
            local[nlocal++] = w;
        }
    for (int k = 1; k < nlocal && st == LOOM_OK; k++)
        st = warm_round(host, s, local[(mine + k) % nlocal], local[(mine - k + nlocal) % nlocal],
                        buf);
    free(local);
    free(buf);
    return st;
}

/* --------------------------------------------------------- progress thread */

void ucx_wake_progress(void)
{
    if (ucx.thread_on)
        pthread_cond_signal(&ucx.work);
}

/* Drives the worker while requests are active, so a collective completes
 * while the caller computes; sleeps on a condition variable otherwise. */
static void *progress_main(void *arg)
{
    (void)arg;
    ucx_idle_state idle = {.beside_caller = 1};
    pthread_mutex_lock(&ucx.lock);
    while (!ucx.thread_stop) {
        if (ucx.nactive == 0) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100 * 1000 * 1000;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&ucx.work, &ucx.lock, &ts);
            idle.since = 0;
            continue;
        }
        int events = sched_progress_all();
        pthread_mutex_unlock(&ucx.lock);
        ucx_idle(&idle, events, ucx.spin_us);
        pthread_mutex_lock(&ucx.lock);
    }
    pthread_mutex_unlock(&ucx.lock);
    return NULL;
}

/* Called with ucx.lock held; returns with it held. */
static void progress_stop(void)
{
    if (!ucx.thread_on)
        return;
    ucx.thread_stop = 1;
    pthread_cond_signal(&ucx.work);
    pthread_mutex_unlock(&ucx.lock);
    pthread_join(ucx.thread, NULL);
    pthread_mutex_lock(&ucx.lock);
    ucx.thread_on = 0;
}

/* ------------------------------------------------------- communicators */

/* The world is "group of 4": its ranks are the world's. */
static void comm_describe(loom_comm *c)
{
    if (c->group.is_world)
        snprintf(c->group.desc, sizeof c->group.desc, "group of %d", c->group.size);
    else
        group_describe(&c->group);
}

static void comm_set_local(loom_comm *c)
{
    c->local = 1;
    pthread_mutex_lock(&ucx.lock);
    for (int i = 0; i < c->group.size && ucx.peers; i++) {
        int w = c->group.world_ranks[i];
        if (w != ucx.world_rank && !ucx.peers[w].local)
            c->local = 0;
    }
    pthread_mutex_unlock(&ucx.lock);
}

/* A communicator whose world ranks the caller fills in, then calls
 * comm_finish. */
static loom_comm *comm_alloc(const loom_host *host, int rank, int size, const ucx_settings *s)
{
    loom_comm *c = calloc(1, sizeof *c);
    if (!c || group_init(&c->group, host, "comm-ucx", rank, size) != LOOM_OK) {
        free(c);
        return NULL;
    }
    c->group.lock = &ucx.lock;
    c->set = *s;
    return c;
}

static void comm_finish(loom_comm *c)
{
    comm_set_local(c);
    comm_describe(c);
}

/* The communicator's id, the same on every member: the leader takes the
 * store's next "uid" and puts it under key, the others read it there
 * (waiting up to timeout_s). It separates the tags of communicators and
 * names their store keys. LOOM_OK or the store's status. */
static int comm_agree_uid(loom_comm *c, const char *key, int leader, double timeout_s)
{
    const loom_host *h = c->group.host;
    int64_t uid = 0;
    size_t len = 0;
    int st = leader ? h->kv_add(h, "uid", 1, &uid)
                    : h->kv_get(h, key, &uid, sizeof uid, &len, timeout_s);
    if (st == LOOM_OK && leader)
        st = h->kv_put(h, key, &uid, sizeof uid);
    c->uid = uid;
    c->tag_id = (uint64_t)uid;
    snprintf(c->group.id, sizeof c->group.id, "%lld", (long long)uid);
    return st;
}

static void comm_free(loom_comm *c)
{
    if (!c)
        return;
    group_release(&c->group);
    free(c);
}

/* The group is out of step (a collective failed half way, or timed out
 * with messages still on their way): everything else in flight on it fails
 * now rather than at its own timeout, and later calls fail at once. Called
 * with ucx.lock held. */
void ucx_comm_fail(loom_comm *c, int status, const char *why)
{
    if (!group_fail(&c->group, status, why))
        return;
    ucx.failed = 1;
    for (comm_pending *p = c->group.pending; p; p = p->next) {
        loom_comm_request *r = p->request;
        if (r->status != LOOM_IN_PROGRESS)
            continue;
        char what[400];
        ucx_req_describe(r, what, sizeof what);
        sched_fail(r, status, "comm-ucx: %s abandoned: the group failed: %s", what,
                   c->group.failure);
    }
}

int ucx_create_world(const loom_host *host, loom_comm **out)
{
    if (!out)
        return LOOM_ERR_INVALID;
    *out = NULL;
    int st = group_check_world(host, "comm-ucx");
    if (st != LOOM_OK)
        return st;
    if (host->world_size > 65536)
        return host->error(host, LOOM_ERR_NOT_SUPPORTED,
                           "comm-ucx: %d ranks is more than the 65536 its tags can address",
                           host->world_size);
    ucx_settings s;
    st = ucx_settings_read(host, &s);
    if (st != LOOM_OK)
        return st;

    pthread_mutex_lock(&ucx.lock);
    if (ucx.refs == 0) {
        st = process_start(host, &s);
    } else if (ucx.world_size != host->world_size || ucx.world_rank != host->rank) {
        st = host->error(host, LOOM_ERR_INVALID,
                         "comm-ucx: a second world of %d ranks (this rank %d) while one of %d "
                         "(rank %d) is alive in this process",
                         host->world_size, host->rank, ucx.world_size, ucx.world_rank);
    }
    int k = ucx.nworlds++;
    if (st == LOOM_OK)
        ucx.refs++;
    pthread_mutex_unlock(&ucx.lock);
    if (st != LOOM_OK)
        return st;

    loom_comm *c = comm_alloc(host, host->rank, host->world_size, &s);
    if (!c) {
        st = host->error(host, LOOM_ERR_NO_MEMORY, "comm-ucx: out of memory");
    } else {
        group_set_world(&c->group);
        comm_finish(c);
        char key[64];
        snprintf(key, sizeof key, "world/%d", k);
        st = comm_agree_uid(c, key, host->rank == 0, s.timeout_s);
        if (st != LOOM_OK && host->rank != 0)
            st = host->error(host, st,
                             "comm-ucx: rank 0 did not publish the id of world communicator "
                             "#%d within %.1f s",
                             k, s.timeout_s);
    }
    if (st != LOOM_OK) {
        comm_free(c);
        pthread_mutex_lock(&ucx.lock);
        if (--ucx.refs == 0) {
            ucx.failed = 1;
            process_teardown(host);
        }
        pthread_mutex_unlock(&ucx.lock);
        return st;
    }
    *out = c;
    return LOOM_OK;
}

/* Collective over the listed ranks only: subgroup rank 0 takes an id from
 * the store and the others read it, so disjoint subgroups form at once. */
int ucx_create_subgroup(loom_comm *parent, const int *ranks, int nranks, loom_comm **out)
{
    if (!out || !parent)
        return LOOM_ERR_INVALID;
    *out = NULL;
    const comm_group *pg = &parent->group;
    const loom_host *h = pg->host;
    int me = rank_list_index(ranks, pg->rank);
    int st = group_refuse_failed(&parent->group, "create_subgroup", LOOM_ERR_REMOTE);
    if (st != LOOM_OK)
        return st;

    uint64_t hash = rank_list_hash(ranks, nranks);
    int nth = group_count_subgroup(&parent->group, hash);
    loom_comm *c = nth < 0 ? NULL : comm_alloc(h, me, nranks, &parent->set);
    if (!c)
        return h->error(h, LOOM_ERR_NO_MEMORY, "comm-ucx: out of memory");
    for (int i = 0; i < nranks; i++)
        c->group.world_ranks[i] = pg->world_ranks[ranks[i]];
    comm_finish(c);
    char key[128];
    snprintf(key, sizeof key, "sub/%s/%016llx/%d", pg->id, (unsigned long long)hash, nth);
    if ((st = comm_agree_uid(c, key, me == 0, parent->set.timeout_s)) != LOOM_OK && me != 0) {
        char nm[64];
        group_name_rank(pg, ranks[0], nm, sizeof nm);
        st = h->error(h, st,
                      "comm-ucx: create_subgroup of %s on %s: rank %s (the subgroup's rank 0) "
                      "did not create it within %.1f s (did it pass the same rank list?)",
                      c->group.desc, pg->desc, nm, parent->set.timeout_s);
    }
    if (st != LOOM_OK) {
        comm_free(c);
        return st;
    }
    pthread_mutex_lock(&ucx.lock);
    ucx.refs++;
    pthread_mutex_unlock(&ucx.lock);
    *out = c;
    return LOOM_OK;
}

int ucx_destroy(loom_comm *c)
{
    if (!c)
        return LOOM_OK;
    const loom_host *h = c->group.host;
    pthread_mutex_lock(&ucx.lock);
    /* Requests not released: unhook them (test/wait on them then fail
     * cleanly); ones still running leave UCX unclean. */
    int orphans = 0;
    for (comm_pending *p = c->group.pending; p; p = p->next) {
        loom_comm_request *r = p->request;
        if (r->status == LOOM_IN_PROGRESS) {
            orphans++;
            sched_fail(r, LOOM_ERR_INVALID, "comm-ucx: %s #%llu: its group was destroyed while it was in flight",
                       loom_comm_op_name(r->call.op), (unsigned long long)r->seq);
        }
        r->comm = NULL;
    }
    c->group.pending = NULL;
    if (orphans) {
        h->log(h, LOOM_LOG_WARN, "comm-ucx: %s destroyed with %d operation(s) still in flight",
               c->group.desc, orphans);
        ucx.failed = 1;
    }
    if (--ucx.refs == 0)
        process_teardown(h);
    pthread_mutex_unlock(&ucx.lock);
    comm_free(c);
    return LOOM_OK;
}

/* Everything in flight on the group fails now, so destroy cannot hang. */
int ucx_abort(loom_comm *c)
{
    if (!c)
        return LOOM_OK;
    pthread_mutex_lock(&ucx.lock);
    ucx_comm_fail(c, LOOM_ERR_REMOTE, "aborted after a failure");
    for (comm_pending *p = c->group.pending; p; p = p->next) {
        loom_comm_request *r = p->request;
        sched_fail(r, LOOM_ERR_REMOTE, "comm-ucx: %s #%llu on %s: aborted after a failure",
                   loom_comm_op_name(r->call.op), (unsigned long long)r->seq, c->group.desc);
    }
    pthread_mutex_unlock(&ucx.lock);
    return LOOM_OK;
}
