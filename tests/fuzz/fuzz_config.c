/* The config parser: loom_config_parse on the input's text, against every
 * layer's settings as the commands check them, then every value printed as
 * `loom settings CONFIG` prints them.
 *
 * Input: the config file's text up to the first NUL byte; each
 * NUL-separated piece after it is one --set override (at most 4). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/settings.h"
#include "loom/status.h"
#include "runtime/config.h"
#include "fuzz_files.h"

enum { MAX_OVERRIDES = 4 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text || loom_cli_add_settings() != LOOM_OK) {
        free(text);
        return 0;
    }
    memcpy(text, data, size);
    text[size] = '\0';
    const char *overrides[MAX_OVERRIDES];
    int noverrides = 0;
    for (char *p = text + strlen(text); p < text + size && noverrides < MAX_OVERRIDES;
         p += strlen(p)) {
        p++; /* past the NUL */
        overrides[noverrides++] = p;
    }
    loom_config *cfg = NULL;
    if (loom_config_parse(text, "fuzz.cfg", overrides, noverrides, &cfg) == LOOM_OK) {
        loom_config_print_values(cfg, fuzz_null());
        loom_config_free(cfg);
    }
    free(text);
    return 0;
}
