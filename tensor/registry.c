/* registry.c - the one place that names cpu/ and cuda/ (besides parallel/comm_nccl.c, for the
 * CUDA plugin's NCCL entries): which backend serves a device, the
 * meta device (shapes and dtypes, no storage, no kernels), device names, and the checks
 * every op makes on its operands' devices. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/backend.h"
#include "cuda/backend.h"
#include "tensor/backend.h"
#include "tensor/tensor_impl.h"

/* ---- the kernel list ---------------------------------------------------------------------- */
const nb__kernel_info nb__kernel_infos[] = {
#define NB__KERNEL_INFO(name, Args, what) {#name, what, offsetof(nb__kernels, name)},
    NB__KERNELS(NB__KERNEL_INFO)
#undef NB__KERNEL_INFO
};
const int nb__kernel_count = (int)(sizeof nb__kernel_infos / sizeof nb__kernel_infos[0]);

const void *nb__kernel_at(const nb__kernels *k, const nb__kernel_info *info) {
    const void *p;
    memcpy(&p, (const char *)k + info->offset, sizeof p);
    return p;
}

/* ---- meta: no memory, no kernels (nb__run_* succeed without running anything) ------------- */
static void *meta_alloc(nb_device dev, size_t nbytes) {
    (void)dev, (void)nbytes;
    return NULL;
}
static void meta_free(nb_device dev, void *p) { (void)dev, (void)p; }
static nb_status meta_copy(nb_device dev, void *dst, const void *src, size_t nbytes) {
    (void)dev, (void)dst, (void)src, (void)nbytes;
    return nb__error(NB_EDEVICE, "meta tensors have no data to copy");
}
static const nb__backend g_meta = {
    .name = "meta",
    .has_storage = false,
    .host_accessible = false,
    .alloc = meta_alloc,
    .free = meta_free,
    .to_host = meta_copy,
    .from_host = meta_copy,
};

const nb__backend *nb__backend_of(nb_device dev, const char *op) {
    switch (dev.type) {
    case NB_DEVICE_CPU: return nb__cpu_backend();
    case NB_DEVICE_CUDA: return nb__cuda_backend(dev, op);
    case NB_DEVICE_META: return &g_meta;
    case NB_DEVICE_GUARD: return nb__guard_backend();
    }
    nb__error(NB_EDEVICE, "%s: unknown device type %d", op, (int)dev.type);
    return NULL;
}

nb_status nb__no_kernel(const nb__backend *be, const char *op, const char *kernel) {
    return nb__error(NB_EUNSUPPORTED, "%s: no %s kernel (%s)", op, be->name, kernel);
}

bool nb__backend_has_kernel(nb_device dev, const char *kernel) {
    const nb__backend *be = nb__backend_of(dev, "device_supports");
    if (!be) return false;
    for (int i = 0; i < nb__kernel_count; i++)
        if (strcmp(nb__kernel_infos[i].name, kernel) == 0)
            return !be->has_storage || nb__kernel_at(&be->k, &nb__kernel_infos[i]) != NULL;
    return false;
}

/* ---- device names --------------------------------------------------------------------------- */
static const char *type_name(nb_device_type t) {
    switch (t) {
    case NB_DEVICE_CPU: return "cpu";
    case NB_DEVICE_CUDA: return "cuda";
    case NB_DEVICE_META: return "meta";
    case NB_DEVICE_GUARD: return "guard";
    }
    return "unknown";
}

const char *nb__device_str(nb_device d, char *buf) {
    if (d.type == NB_DEVICE_CUDA) snprintf(buf, NB__DEVICE_STR, "cuda:%d", d.index);
    else snprintf(buf, NB__DEVICE_STR, "%s", type_name(d.type));
    return buf;
}

const char *nb_device_name(nb_device d, char *buf, size_t n) {
    if (!buf || n == 0) return "";
    char tmp[NB__DEVICE_STR];
    snprintf(buf, n, "%s", nb__device_str(d, tmp));
    return buf;
}

nb_status nb_device_parse(const char *s, nb_device *out) {
    if (!s || !out) return nb__error(NB_ENULL, "device_parse: NULL argument");
    static const struct { const char *name; nb_device_type type; } names[] = {
        {"cpu", NB_DEVICE_CPU}, {"cuda", NB_DEVICE_CUDA}, {"meta", NB_DEVICE_META},
        {"guard", NB_DEVICE_GUARD}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        size_t len = strlen(names[i].name);
        if (strncmp(s, names[i].name, len) != 0) continue;
        const char *rest = s + len;
        if (*rest == '\0') {
            *out = (nb_device){names[i].type, 0};
            return NB_OK;
        }
        if (*rest == ':' && rest[1] >= '0' && rest[1] <= '9') {
            char *end;
            long idx = strtol(rest + 1, &end, 10);
            if (*end == '\0' && idx <= 1024) {
                if (names[i].type != NB_DEVICE_CUDA && idx != 0) break;
                *out = (nb_device){names[i].type, (int)idx};
                return NB_OK;
            }
        }
        break;
    }
    return nb__error(NB_EINVAL, "device_parse: \"%s\" is not a device (expected \"cpu\", "
                     "\"cuda\", \"cuda:N\" or \"meta\")", s);
}

bool nb_device_equal(nb_device a, nb_device b) {
    return a.type == b.type && (a.type != NB_DEVICE_CUDA || a.index == b.index);
}

/* ---- operand checks --------------------------------------------------------------------------- */
bool nb__check_devices(const char *op, nb_tensor *const *ts, int n, nb_device *dev) {
    for (int i = 0; i < n; i++) /* the operand's position stands in for its name */
        if (ts[i] && !nb__live(ts[i]))
            return nb__dead_handle(ts[i], op, (const char *[]){"0", "1", "2", "3", "4", "5",
                                                               "6", "7"}[i < 8 ? i : 7]);
    nb_device d = ts[0]->storage->device;
    for (int i = 1; i < n; i++) {
        if (!ts[i]) continue;
        nb_device e = ts[i]->storage->device;
        if (!nb_device_equal(d, e)) {
            nb__error(NB_EDEVICE, "%s: operands on %s and %s (move them to one device with "
                      "nb_to_device)", op, NB__DEVSTR(d), NB__DEVSTR(e));
            return false;
        }
    }
    if (dev) *dev = d;
    return true;
}

bool nb__host_accessible(const nb_tensor *t) {
    const nb__backend *be = nb__backend_of(t->storage->device, "host_accessible");
    return be && be->host_accessible;
}

bool nb__require_host(const nb_tensor *t, const char *op) {
    if (nb__host_accessible(t)) return true;
    nb__error(NB_EDEVICE, "%s: needs a tensor in host memory, got a %s tensor (copy it with "
              "nb_to_device(t, NB_CPU) first)", op, NB__DEVSTR(t->storage->device));
    return false;
}

bool nb_device_supports(nb_device dev, const char *op_name) {
    if (!op_name) return false;
    const nb__backend *be = nb__backend_of(dev, "device_supports");
    if (!be) return false;
    /* An op name: every kernel it uses; a kernel name: that kernel. */
    const char *const *ks = nb__op_kernels(op_name);
    if (!ks) return nb__backend_has_kernel(dev, op_name);
    for (; *ks; ks++)
        if (!nb__backend_has_kernel(dev, *ks)) return false;
    return true;
}
