/* The device-staging comm table is complete: every op of loom_comm_api
 * has a staged entry. The suite that uses the table runs only on GPU
 * machines, so this check runs everywhere, without a device, and a table
 * that misses an op fails here rather than as a crash on the GPU. The check
 * itself is shown to find a hole: a copy with split emptied must fail and
 * name it. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "device_staging.h"
#include "loom/status.h"
#include "rank_check.h"

int main(void)
{
    char why[256] = "";
    int rc = loom_staged_table_check(&loom_staged_comm_api, why, sizeof why);
    CHECK(rc == LOOM_OK, "the staged table: %s", why);

    loom_comm_api holed;
    memcpy(&holed, &loom_staged_comm_api, sizeof holed);
    holed.split = NULL;
    char want[64];
    snprintf(want, sizeof want, "(split, at byte %zu of", offsetof(loom_comm_api, split));
    rc = loom_staged_table_check(&holed, why, sizeof why);
    CHECK(rc != LOOM_OK && strstr(why, want), "a table without split: %s, '%s'",
          loom_status_string(rc), why);

    holed = loom_staged_comm_api;
    holed.struct_size = 8;
    rc = loom_staged_table_check(&holed, why, sizeof why);
    CHECK(rc != LOOM_OK && strstr(why, "struct_size is 8"), "a table of an older size: %s, '%s'",
          loom_status_string(rc), why);

    printf("staged comm table: %s\n", failures ? "FAILED" : "every op staged");
    return failures ? 1 : 0;
}
