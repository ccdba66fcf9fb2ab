/* checkpoint.c - training checkpoints (nabla/checkpoint.h): one safetensors file holding
 * model, optimizer, schedule, loader position, generator positions and step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/io_impl.h"
#include "nabla/checkpoint.h"
#include "nabla/io.h"
#include "nabla/optim.h"
#include "tensor/tensor_impl.h"
#include "tensor/trace.h"

/* u64 state is stored bit for bit in 0-dim I64 tensors. */
static nb_status add_u64(nb_state_list *l, const char *name, uint64_t v) {
    int64_t x;
    memcpy(&x, &v, sizeof x);
    nb_tensor *t = nb_from_buffer(&x, NULL, 0, NB_I64);
    nb_status st = t ? nb_state_list_add(l, NULL, name, t) : nb_last_status();
    nb_tensor_free(nb__scope_take(t));
    return st;
}

static nb_status read_u64(nb_safetensors *f, const char *path, const char *name, uint64_t *out) {
    nb_scope_begin();
    nb_status st = NB_OK;
    nb_tensor *t = nb_safetensors_find(f, name) >= 0 ? nb_safetensors_get(f, name) : NULL;
    if (!t || t->dtype != NB_I64 || nb_numel(t) != 1)
        st = nb__error(NB_EFORMAT, "checkpoint_load: %s has no valid \"%s\" entry", path, name);
    else
        st = nb_read(t, out, 1, NB_I64); /* the 64 bits as stored */
    nb_scope_end();
    return st;
}

/* An error of the safetensors writer under the name of the call the user made
 * ("checkpoint_save: run.ckpt is a FIFO, ..."); any other error (an op's, the loader's) is
 * kept as it is. Returns st. */
static nb_status as_checkpoint_error(nb_status st) {
    static const char prefix[] = "safetensors_save: ";
    const char *msg = nb_last_error();
    if (st == NB_OK || strncmp(msg, prefix, sizeof prefix - 1) != 0) return st;
    char rest[512]; /* a copy: nb__error writes the buffer msg points into */
    snprintf(rest, sizeof rest, "%s", msg + sizeof prefix - 1);
    return nb__error(st, "checkpoint_save: %s", rest);
}

/* Spans (tensor/trace.h): "checkpoint save" around a save (the snapshot of the state, then
 * "checkpoint write" inside it), "checkpoint load" around a load. */
static nb_status checkpoint_save(const char *path, const nb_checkpoint *c);
nb_status nb_checkpoint_save(const char *path, const nb_checkpoint *c) {
    int tok = NB__SPAN_BEGIN("checkpoint save", NULL, NB__CAT_IO);
    nb_status st = checkpoint_save(path, c);
    NB__SPAN_END(tok);
    return st;
}

static nb_status checkpoint_save(const char *path, const nb_checkpoint *c) {
    if (!path || !c || !c->model)
        return nb__error(NB_ENULL, "checkpoint_save: %s is NULL",
                         !path ? "path" : !c ? "the checkpoint" : "the model");
    nb_state_list l = {0};
    nb_status st = nb_state_list_add_module(&l, "model.", c->model);
    if (st == NB_OK && c->optim) st = nb_state_list_add_params(&l, "optim.", nb_optim_state(c->optim));
    if (st == NB_OK && c->sched) st = nb_state_list_add_params(&l, "sched.", nb_sched_state(c->sched));
    if (st == NB_OK && c->loader) {
        nb_loader_state pos;
        st = nb_loader_get_state(c->loader, &pos);
        if (st == NB_OK) st = add_u64(&l, "loader.epoch", (uint64_t)pos.epoch);
        if (st == NB_OK) st = add_u64(&l, "loader.batch", (uint64_t)pos.batch);
    }
    for (int i = 0; st == NB_OK && i < c->ngens; i++) {
        char name[64];
        nb_generator *g = c->gens[i];
        snprintf(name, sizeof name, "rng.%d.seed", i);
        st = add_u64(&l, name, nb_generator_seed(g));
        snprintf(name, sizeof name, "rng.%d.stream", i);
        if (st == NB_OK) st = add_u64(&l, name, nb_generator_stream(g));
        snprintf(name, sizeof name, "rng.%d.offset", i);
        if (st == NB_OK) st = add_u64(&l, name, nb_generator_offset(g));
    }
    if (st == NB_OK) st = add_u64(&l, "step", (uint64_t)c->step);
    /* metadata: the format, the program and "config.<name>" = value per setting */
    int nmeta = 2 + (c->program ? 1 : 0) + (c->nconfig > 0 ? c->nconfig : 0);
    const char **keys = calloc((size_t)nmeta, sizeof *keys);
    const char **vals = calloc((size_t)nmeta, sizeof *vals);
    char **owned = calloc((size_t)nmeta, sizeof *owned);
    if (st == NB_OK && (!keys || !vals || !owned))
        st = nb__error(NB_ENOMEM, "checkpoint_save: out of memory");
    int m = 0;
    if (st == NB_OK) {
        keys[m] = "format", vals[m++] = "pt";
        keys[m] = "nabla_checkpoint", vals[m++] = "1";
        if (c->program) keys[m] = "program", vals[m++] = c->program;
    }
    for (int i = 0; st == NB_OK && i < c->nconfig; i++) {
        const char *name = c->config_names ? c->config_names[i] : NULL;
        const char *val = c->config_values ? c->config_values[i] : NULL;
        if (!name || !val) {
            st = nb__error(NB_ENULL, "checkpoint_save: setting %d has no %s", i,
                           !name ? "name" : "value");
            break;
        }
        size_t n = strlen(name) + sizeof "config.";
        if (!(owned[m] = malloc(n))) {
            st = nb__error(NB_ENOMEM, "checkpoint_save: out of memory");
            break;
        }
        snprintf(owned[m], n, "config.%s", name);
        keys[m] = owned[m], vals[m++] = val;
    }
    if (st == NB_OK) {
        int tok = NB__SPAN_BEGIN("checkpoint write", NULL, NB__CAT_IO);
        st = as_checkpoint_error(nb_safetensors_save(path, l.names, l.tensors, l.count, keys,
                                                     vals, m));
        NB__SPAN_END(tok);
    }
    for (int i = 0; owned && i < nmeta; i++) free(owned[i]);
    free(owned);
    free(keys);
    free(vals);
    nb_state_list_deinit(&l);
    /* the state views own small tensors: back to the cache, not held until the next save */
    nb_optim_state_release(c->optim);
    nb_sched_state_release(c->sched);
    return st;
}

static nb_status checkpoint_load(const char *path, nb_checkpoint *c);
nb_status nb_checkpoint_load(const char *path, nb_checkpoint *c) {
    int tok = NB__SPAN_BEGIN("checkpoint load", NULL, NB__CAT_IO);
    nb_status st = checkpoint_load(path, c);
    NB__SPAN_END(tok);
    return st;
}

static nb_status checkpoint_load(const char *path, nb_checkpoint *c) {
    if (!path || !c || !c->model)
        return nb__error(NB_ENULL, "checkpoint_load: %s is NULL",
                         !path ? "path" : !c ? "the checkpoint" : "the model");
    nb__remove_stale_temps(path); /* a run restarted after a kill during a save */
    nb_safetensors *f = nb_safetensors_open(path);
    if (!f) return nb_last_status();
    nb_status st = NB_OK;
    if (!nb_safetensors_metadata(f, "nabla_checkpoint"))
        st = nb__error(NB_EFORMAT, "checkpoint_load: %s is a safetensors file but not a nabla "
                       "checkpoint (to load weights only, use nb_module_load)", path);
    /* The run's identity before anything else: another program's file, or settings that
     * differ, change nothing. */
    const char *writer = nb_safetensors_metadata(f, "program");
    if (st == NB_OK && c->program && writer && strcmp(writer, c->program) != 0)
        st = nb__error(NB_EINVAL, "checkpoint_load: %s was written by %s, not by %s", path,
                       writer, c->program);
    for (int i = 0; st == NB_OK && i < c->nconfig; i++) {
        const char *name = c->config_names ? c->config_names[i] : NULL;
        const char *val = c->config_values ? c->config_values[i] : NULL;
        if (!name || !val) {
            st = nb__error(NB_ENULL, "checkpoint_load: setting %d has no %s", i,
                           !name ? "name" : "value");
            break;
        }
        char key[256];
        snprintf(key, sizeof key, "config.%s", name);
        const char *saved = nb_safetensors_metadata(f, key);
        if (!saved || strcmp(saved, val) == 0) continue;
        bool allowed = false;
        for (int k = 0; k < c->nmay_change && c->may_change && !allowed; k++)
            allowed = c->may_change[k] && strcmp(c->may_change[k], name) == 0;
        if (!allowed)
            st = nb__error(NB_EINVAL, "checkpoint_load: %s was written with %s=%s; this run has "
                           "%s=%s", path, name, saved, name, val);
    }
    /* Read every scalar first, so a bad file changes nothing. */
    uint64_t step = 0, epoch = 0, batch = 0;
    uint64_t rng[64][3];
    if (c->ngens > 64) st = nb__error(NB_EINVAL, "checkpoint_load: at most 64 generators");
    if (st == NB_OK) st = read_u64(f, path, "step", &step);
    if (st == NB_OK && c->loader) st = read_u64(f, path, "loader.epoch", &epoch);
    if (st == NB_OK && c->loader) st = read_u64(f, path, "loader.batch", &batch);
    for (int i = 0; st == NB_OK && i < c->ngens; i++) {
        const char *part[3] = {"seed", "stream", "offset"};
        for (int k = 0; st == NB_OK && k < 3; k++) {
            char name[64];
            snprintf(name, sizeof name, "rng.%d.%s", i, part[k]);
            st = read_u64(f, path, name, &rng[i][k]);
        }
    }
    /* Optimizer and schedule state are validated by their loaders before they change
     * anything; the model is loaded first only after both lists were read. */
    nb_state_list ol = {0}, sl = {0};
    if (st == NB_OK && c->optim) st = nb_state_list_add_file(&ol, f, "optim.");
    if (st == NB_OK && c->sched) st = nb_state_list_add_file(&sl, f, "sched.");
    if (st == NB_OK) st = nb_module_load_from(c->model, f, "model.", true);
    if (st == NB_OK && c->optim) st = nb_optim_load_state(c->optim, ol.names, ol.tensors, ol.count);
    if (st == NB_OK && c->sched) st = nb_sched_load_state(c->sched, sl.names, sl.tensors, sl.count);
    if (st == NB_OK && c->loader)
        st = nb_loader_set_state(c->loader, &(nb_loader_state){(int64_t)epoch, (int64_t)batch});
    for (int i = 0; st == NB_OK && i < c->ngens; i++) {
        nb_generator *g = c->gens[i];
        if (rng[i][0] != nb_generator_seed(g)) {
            st = nb__error(NB_EINVAL, "checkpoint_load: generator %d was seeded with %llu, the "
                           "checkpoint's with %llu", i, (unsigned long long)nb_generator_seed(g),
                           (unsigned long long)rng[i][0]);
            break;
        }
        st = nb_generator_set_stream(g, rng[i][1]);
        if (st == NB_OK) st = nb_generator_set_offset(g, rng[i][2]);
    }
    if (st == NB_OK) c->step = (int64_t)step;
    nb_state_list_deinit(&ol);
    nb_state_list_deinit(&sl);
    nb_safetensors_close(f);
    return st;
}
