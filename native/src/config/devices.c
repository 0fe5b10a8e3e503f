/* Device identity in a configuration: a UUID matches with or without its GPU-/MIG- prefix and in any case
 * (the driver prints GPU-<hex>, NVML names a MIG instance MIG-<hex>), and each device's memory limit. */
#include <strings.h>

#include "gpuslice/config.h"

static const char *uuid_hex(const char *u)
{
    return !strncasecmp(u, "GPU-", 4) || !strncasecmp(u, "MIG-", 4) ? u + 4 : u;
}

int gs_uuid_same(const char *a, const char *b)
{
    return a && b && !strcasecmp(uuid_hex(a), uuid_hex(b));
}

int gs_config_device_index(const struct gs_config *cfg, const char *uuid)
{
    for (int i = 0; i < cfg->device_count; i++)
        if (gs_uuid_same(cfg->devices[i], uuid)) return i;
    return -1;
}

uint64_t gs_config_limit_for_uuid(const struct gs_config *cfg, const char *uuid, int *found)
{
    int i = gs_config_device_index(cfg, uuid);
    if (found) *found = i >= 0;
    return i >= 0 ? cfg->device_limit[i] : 0;
}
