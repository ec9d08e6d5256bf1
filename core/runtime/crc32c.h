/* loom runtime — CRC32C (Castagnoli): the checksum of every checkpoint file
 * (train/ckpt_format.h) and of every chunk the nvme tier keeps (plugins reach it
 * through the host table: loom_host.crc32c and copy_crc32c). */
#ifndef LOOM_RUNTIME_CRC32C_H
#define LOOM_RUNTIME_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The CRC32C of n bytes, the SSE4.2 instruction (three chains at once) where
 * the CPU has it.
 * crc32c("123456789") = 0xE3069283. */
uint32_t loom_crc32c(const void *data, size_t n);
/* The same by table, whatever the CPU (the tests compare the two). */
uint32_t loom_crc32c_portable(const void *data, size_t n);
/* memcpy that returns the CRC32C of what it copied, computed while the
 * bytes are still in cache. */
uint32_t loom_copy_crc32c(void *dst, const void *src, size_t n);
/* The CRC32C of what crc was the CRC32C of, followed by n bytes more:
 * loom_crc32c_extend(loom_crc32c(a, na), b, nb) is the CRC32C of a then b,
 * and loom_crc32c_extend(0, p, n) = loom_crc32c(p, n). */
uint32_t loom_crc32c_extend(uint32_t crc, const void *data, size_t n);

#endif
