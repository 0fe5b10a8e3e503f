/* Fuzz smoke for `make test` without clang: replay the corpus through the libFuzzer target, then
 * feed it seeded random mutations of the corpus for N seconds (ASan/UBSan watching). */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s CORPUS_DIR SECONDS\n", argv[0]);
        return 2;
    }
    static char corpus[256][4096];
    static size_t lens[256];
    int n = 0;
    DIR *d = opendir(argv[1]);
    if (!d) { perror(argv[1]); return 2; }
    struct dirent *e;
    while ((e = readdir(d)) && n < 256) {
        if (e->d_name[0] == '.') continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", argv[1], e->d_name);
        FILE *f = fopen(p, "rb");
        if (!f) continue;
        lens[n] = fread(corpus[n], 1, sizeof corpus[n], f);
        fclose(f);
        LLVMFuzzerTestOneInput((const uint8_t *)corpus[n], lens[n]);
        n++;
    }
    closedir(d);
    if (!n) { fprintf(stderr, "empty corpus %s\n", argv[1]); return 2; }
    static const char *tokens[] = {"=", "\n", "#", ",", "version", "devices", "memory_limit.", "GPU-", "MIG-", "g", "Ki",
                                   "18446744073709551615", "99999999999999999999", "\0", "compute=101", " ", "\r\n"};
    time_t end = time(NULL) + atoi(argv[2]);
    unsigned long iters = 0;
    char buf[8192];
    while (time(NULL) < end) {
        for (int k = 0; k < 1000; k++, iters++) {
            int i = (int)(next() % (uint64_t)n);
            size_t len = lens[i];
            memcpy(buf, corpus[i], len);
            int muts = 1 + (int)(next() % 8);
            for (int m = 0; m < muts; m++) {
                uint64_t r = next();
                size_t pos = len ? (size_t)(r >> 8) % len : 0;
                switch (r % 4) {
                case 0: if (len) buf[pos] = (char)(next() & 0xff); break;          /* flip a byte */
                case 1: if (len) { memmove(buf + pos, buf + pos + 1, len - pos - 1); len--; } break; /* drop */
                case 2: {                                                          /* insert a token */
                    const char *t = tokens[next() % (sizeof tokens / sizeof tokens[0])];
                    size_t tl = strlen(t) ? strlen(t) : 1;
                    if (len + tl < sizeof buf) { memmove(buf + pos + tl, buf + pos, len - pos); memcpy(buf + pos, t, tl); len += tl; }
                    break;
                }
                case 3: if (len && len * 2 < sizeof buf) { memcpy(buf + len, buf, len); len *= 2; } break; /* repeat */
                }
            }
            LLVMFuzzerTestOneInput((const uint8_t *)buf, len);
        }
    }
    fprintf(stderr, "fuzz replay: %d corpus files, %lu mutated inputs, no crash\n", n, iters);
    return 0;
}
