/* llm.c's GPT-2 checkpoint reader (model/formats.c): the input is the
 * file, read as `model.init = "checkpoint"` reads it (header, then the
 * parameters, fp32 or bf16), and as `loom ckpt` reads a header alone. */
#include <stdint.h>
#include <stdlib.h>

#include "loom/status.h"
#include "loom/tensor.h"
#include "model/formats.h"
#include "fuzz_files.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[1024];
    fuzz_path(path, sizeof path, "gpt2.bin");
    fuzz_write(path, data, size);
    loom_gpt2_shape shape;
    loom_dtype dtype;
    if (loom_checkpoint_read_header(path, &shape, &dtype) != LOOM_OK)
        return 0;
    float *params = NULL;
    loom_gpt2_shape read_shape;
    /* The shape the header gave is what a config deriving from it expects. */
    if (loom_checkpoint_read(path, &shape, &read_shape, &params) == LOOM_OK) {
        /* touch every parameter: a short read would leave some unwritten */
        volatile float sum = 0.0f;
        size_t n = loom_gpt2_param_count(&read_shape);
        for (size_t i = 0; i < n; i++)
            sum += params[i];
        (void)sum;
    }
    free(params);
    return 0;
}
