/* Make a corrupt copy of a plugin, the same size as the original, for the
 * tests of what loom does with a library whose bytes went bad.
 *
 *   plugin_corrupt IN OUT init    the first constructor (.init_array[0])
 *                                 points at the file's first byte, which is
 *                                 not code: dlopen crashes running it, and
 *                                 nothing short of running it can tell
 *   plugin_corrupt IN OUT reloc   the first dynamic relocation writes far
 *                                 outside the library: the dynamic loader
 *                                 would crash doing it
 *
 * Exit 0 when done, 1 when IN is not a library this can corrupt. */
#include <elf.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static unsigned char *file;
static size_t file_size;
static Elf64_Ehdr *eh;

static void die(const char *why)
{
    fprintf(stderr, "plugin_corrupt: %s\n", why);
    exit(1);
}

/* The file bytes at address addr, n of them. */
static void *at_address(uint64_t addr, uint64_t n)
{
    Elf64_Phdr *ph = (Elf64_Phdr *)(file + eh->e_phoff);
    for (int i = 0; i < eh->e_phnum; i++) {
        if (ph[i].p_type != PT_LOAD || addr < ph[i].p_vaddr ||
            addr + n > ph[i].p_vaddr + ph[i].p_filesz)
            continue;
        return file + ph[i].p_offset + (addr - ph[i].p_vaddr);
    }
    return NULL;
}

static uint64_t dyn_value(const Elf64_Dyn *dyn, int64_t tag)
{
    for (; dyn->d_tag != DT_NULL; dyn++)
        if (dyn->d_tag == tag)
            return dyn->d_un.d_val;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 4 || (strcmp(argv[3], "init") && strcmp(argv[3], "reloc")))
        die("usage: plugin_corrupt IN OUT init|reloc");
    FILE *in = fopen(argv[1], "rb");
    struct stat st;
    if (!in || fstat(fileno(in), &st) != 0)
        die("cannot open IN");
    file_size = (size_t)st.st_size;
    file = malloc(file_size);
    if (!file || fread(file, 1, file_size, in) != file_size)
        die("cannot read IN");
    fclose(in);
    eh = (Elf64_Ehdr *)file;
    if (file_size < sizeof *eh || memcmp(eh->e_ident, ELFMAG, SELFMAG) ||
        eh->e_ident[EI_CLASS] != ELFCLASS64)
        die("IN is not a 64-bit ELF file");
    Elf64_Phdr *ph = (Elf64_Phdr *)(file + eh->e_phoff);
    const Elf64_Dyn *dyn = NULL;
    for (int i = 0; i < eh->e_phnum; i++)
        if (ph[i].p_type == PT_DYNAMIC)
            dyn = (const Elf64_Dyn *)(file + ph[i].p_offset);
    if (!dyn)
        die("IN has no dynamic section");
    uint64_t rela_at = dyn_value(dyn, DT_RELA), rela_bytes = dyn_value(dyn, DT_RELASZ);
    Elf64_Rela *rela = rela_at ? at_address(rela_at, rela_bytes) : NULL;
    size_t nrela = rela ? rela_bytes / sizeof *rela : 0;

    if (!strcmp(argv[3], "reloc")) {
        if (!nrela)
            die("IN has no relocations");
        rela[0].r_offset = (uint64_t)1 << 42;
    } else {
        uint64_t init = dyn_value(dyn, DT_INIT_ARRAY);
        uint64_t *slot = init ? at_address(init, sizeof *slot) : NULL;
        if (!slot)
            die("IN has no constructor");
        /* The slot holds the address itself (packed relocations) or a
         * relocation's addend says it: both now say the file's start. */
        *slot = 0;
        for (size_t i = 0; i < nrela; i++)
            if (rela[i].r_offset == init)
                rela[i].r_addend = 0;
    }
    FILE *out = fopen(argv[2], "wb");
    if (!out || fwrite(file, 1, file_size, out) != file_size || fclose(out) != 0)
        die("cannot write OUT");
    free(file);
    return 0;
}
