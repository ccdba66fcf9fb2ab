/* module_summary.c - nb_module_summary (nabla/run.h): the module tree with each module's
 * own parameters (name and shape) and the parameter count of each subtree, like PyTorch's
 * print(model). */
#include "nabla/run.h"

#include <errno.h>
#include <string.h>

/* n with thousands separators: 814090 -> "814,090". */
static const char *grouped(int64_t n, char *buf, size_t size) {
    char digits[32];
    int k = snprintf(digits, sizeof digits, "%lld", (long long)(n < 0 ? -n : n));
    size_t o = 0;
    if (n < 0 && o + 1 < size) buf[o++] = '-';
    for (int i = 0; i < k && o + 2 < size; i++) {
        if (i > 0 && (k - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o] = 0;
    return buf;
}

/* The module's own parameters (direct ones: no dot in their names) with their shapes. */
static void own_params(nb_module *m, FILE *out) {
    const nb_params *ps = nb_parameters(m);
    for (int i = 0; ps && i < ps->count; i++) {
        if (strchr(ps->names[i], '.')) continue;
        const int64_t *shape = nb_shape(ps->tensors[i]);
        fprintf(out, "  %s [", ps->names[i]);
        for (int d = 0; d < nb_ndim(ps->tensors[i]); d++)
            fprintf(out, "%s%lld", d ? ", " : "", (long long)shape[d]);
        fputc(']', out);
    }
}

static void node(nb_module *m, const char *name, FILE *out, int level, int depth) {
    char n[40];
    int64_t count = nb_num_parameters(m);
    fprintf(out, "%*s", 2 * level, "");
    if (name) fprintf(out, "(%s): ", name);
    fputs(nb_module_type(m) ? nb_module_type(m) : "Module", out);
    own_params(m, out);
    if (level == 0) fprintf(out, "  (%s parameters)", grouped(count, n, sizeof n));
    else if (count > 0) fprintf(out, "  (%s)", grouped(count, n, sizeof n));
    fputc('\n', out);
    if (depth > 0 && level >= depth) return;
    for (int i = 0; i < nb_module_num_children(m); i++)
        node(nb_module_child_at(m, i), nb_module_child_name(m, i), out, level + 1, depth);
}

nb_status nb_module_summary(nb_module *m, FILE *out, int depth) {
    if (!m || !out)
        return nb_set_error(NB_ENULL, "module_summary: %s is NULL", m ? "the stream" : "the module");
    if (depth < 0)
        return nb_set_error(NB_EINVAL, "module_summary: depth must be >= 0 (got %d)", depth);
    errno = 0;
    node(m, NULL, out, 0, depth);
    if (ferror(out))
        return nb_set_error(NB_EIO, "module_summary: writing failed: %s",
                            strerror(errno ? errno : EIO));
    return NB_OK;
}
