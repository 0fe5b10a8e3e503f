/* Shared by the CPU doubles of libcuda and libnvidia-ml: device count, memory and UUIDs, so both
 * describe the same fake cards. Env: GSDOUBLE_DEVICES (default 2), GSDOUBLE_TOTAL (bytes, default
 * 16 GiB). */
#ifndef GSDOUBLE_COMMON_H
#define GSDOUBLE_COMMON_H
#include <stdio.h>
#include <stdlib.h>

static inline int dbl_device_count(void)
{
    const char *e = getenv("GSDOUBLE_DEVICES");
    int n = e ? atoi(e) : 2;
    return n < 0 ? 0 : n > 8 ? 8 : n;
}

static inline unsigned long long dbl_total(void)
{
    const char *e = getenv("GSDOUBLE_TOTAL");
    return e ? strtoull(e, NULL, 10) : 16ull << 30;
}

static inline void dbl_uuid_bytes(int dev, unsigned char b[16])
{
    for (int k = 0; k < 16; k++) b[k] = (unsigned char)(k * 17 + dev);
    b[0] = (unsigned char)(0xA0 + dev);
}

static inline void dbl_uuid_string(int dev, char out[64])
{
    unsigned char b[16];
    dbl_uuid_bytes(dev, b);
    char *p = out + sprintf(out, "GPU-");
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) *p++ = '-';
        p += sprintf(p, "%02x", b[i]);
    }
}
#endif
