/* loom model — the model layer's settings: model.* (the model's shape, its
 * init, its matrix products) and data.* (the token shards the data loader
 * reads). */
#ifndef LOOM_MODEL_SETTINGS_H
#define LOOM_MODEL_SETTINGS_H

#include "runtime/config.h"

extern const loom_config_settings loom_model_settings;

#endif
