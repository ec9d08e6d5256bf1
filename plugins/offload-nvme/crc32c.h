/* CRC32C (Castagnoli), the checksum offload-nvme keeps per chunk. */
#ifndef LOOM_NVME_CRC32C_H
#define LOOM_NVME_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The CRC32C of n bytes, the SSE4.2 instruction (three chains at once) where
 * the CPU has it.
 * crc32c("123456789") = 0xE3069283. */
uint32_t nvme_crc32c(const void *data, size_t n);
/* The same by table, whatever the CPU (the tests compare the two). */
uint32_t nvme_crc32c_portable(const void *data, size_t n);
/* memcpy that returns the CRC32C of what it copied, computed while the
 * bytes are still in cache. */
uint32_t nvme_copy_crc32c(void *dst, const void *src, size_t n);

#endif
