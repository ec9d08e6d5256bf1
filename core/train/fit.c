/* loom train — the machine checked before anything is allocated, by the
 * check the trainer's caller passes (fit.h): the trainer says which ranks
 * share this machine and what the pipeline runs, and the ranks agree on
 * the outcome, so one machine that cannot hold the job stops every rank at
 * once, and none waits out comm.timeout_s in a collective of the
 * strategies' setup. */
#include "runtime/runtime.h"
#include "train/fit.h"
#include "train/trainer.h"

int trainer_check_machine(trainer *t, loom_train_machine_check check)
{
    if (!check)
        return LOOM_OK;
    /* a launcher places ranks in blocks per node */
    const loom_launch_env *env = loom_runtime_env(t->job.rt);
    loom_train_machine m = {.cfg = t->job.cfg,
                            .rank = t->job.rank,
                            .world = t->job.world,
                            .local = env->local_size > 0 ? env->local_size : 1,
                            .first = env->rank - (env->local_rank >= 0 ? env->local_rank : 0),
                            .schedule =
                                t->job.mesh->sizes[LOOM_AXIS_PP] > 1 ? &t->pipe.schedule : NULL};
    if (m.first < 0 || m.first + m.local > t->job.world) {
        m.first = t->job.rank;
        m.local = 1;
    }
    return trainer_agree(t, "cannot start", check(&m));
}
