/* loom train — the train layer's settings: train.* (the optimizer, the
 * precision, evaluation, checkpoints and samples of a training run). */
#ifndef LOOM_TRAIN_SETTINGS_H
#define LOOM_TRAIN_SETTINGS_H

#include "runtime/config.h"

extern const loom_config_settings loom_train_settings;

#endif
