/* gpt_parallel.c - the GPT's parallel-specific code (nabla/gpt.h): its tensor-parallel plan
 * (Megatron-LM's layout, with sequence parallelism) and its pipeline split. Everything else is
 * the one model of zoo/gpt.c and the generic parallel layer. */
#include "nabla/nabla.h"
#include "zoo/gpt_impl.h"

/* Megatron's layout: q/k/v and the MLP's first projection column-wise (q, k, v split per
 * head), the two output projections row-wise, the vocabulary split in the embedding and in the
 * tied head (whose output feeds the vocab-parallel cross entropy), and with sequence
 * parallelism the norms, dropouts and positions on sequence shards. */
nb_status nb_gpt_parallelize(nb_module *gpt, const nb_mesh *mesh, const nb_parallelize_opts *o) {
    const nb_gpt_config *c = nb_gpt_get_config(gpt);
    if (!c) return nb_set_error(NB_EINVAL, "nb_gpt_parallelize: the module is not a GPT");
    if (o && NB__OPTS_CHECK(o, nb_parallelize_opts, "nb_gpt_parallelize",
                            "nb_parallelize_defaults()", "o.sequence_parallel = true") != NB_OK)
        return nb_last_status();
    const int64_t hd = c->n_embd / c->n_head; /* a rank holds whole heads */
    const char *dim = o && o->tp_dim ? o->tp_dim : "tp";
    const int T = mesh ? nb_mesh_size(mesh, dim) : 0;
    if (T > 0 && c->n_head % T)
        return nb_set_error(NB_EINVAL, "nb_gpt_parallelize: n_head %d does not divide by the %s "
                            "size %d (a rank holds whole heads)", (int)c->n_head, dim, T);
    if (T > 0 && o && o->sequence_parallel && c->block_size % T)
        return nb_set_error(NB_EINVAL, "nb_gpt_parallelize: with sequence parallelism the context "
                            "(block_size %d) must divide by the %s size %d (each rank holds an "
                            "equal part of every sequence)", (int)c->block_size, dim, T);
    const nb_tp_rule plan[] = {
        {"transformer.wte", NB_TP_VOCAB},
        {"transformer.wpe", NB_TP_SEQUENCE},
        {"transformer.drop", NB_TP_SEQUENCE},
        {"transformer.h.*.ln_*", NB_TP_SEQUENCE},
        {"transformer.h.*.attn.c_attn", NB_TP_COLWISE_FUSED(3), hd},
        {"transformer.h.*.attn.c_proj", NB_TP_ROWWISE, 1, hd},
        {"transformer.h.*.attn.resid_dropout", NB_TP_SEQUENCE},
        {"transformer.h.*.mlp.c_fc", NB_TP_COLWISE},
        {"transformer.h.*.mlp.c_proj", NB_TP_ROWWISE},
        {"transformer.h.*.mlp.dropout", NB_TP_SEQUENCE},
        {"transformer.ln_f", NB_TP_SEQUENCE},
        {"lm_head", NB_TP_COLWISE},
        {0}};
    return nb_parallelize(gpt, mesh, plan, o);
}

/* The layers: the embedding, each block, the head; the loss on the last stage. */
nb_pipeline *nb_gpt_pipeline_new(nb_module *gpt, const nb_mesh *mesh, const nb_pipeline_opts *o) {
    if (!nb_gpt_get_config(gpt)) {
        nb_set_error(NB_EINVAL, "nb_gpt_pipeline_new: the module is not a GPT");
        return NULL;
    }
    const nb_pipe_layer layers[] = {
        {"transformer.wte transformer.wpe transformer.drop", nb__gpt_embed, NULL, true},
        {"transformer.h.*", NULL, NULL, false},
        {"transformer.ln_f lm_head", nb__gpt_head, NULL, true}};
    if (o && NB__OPTS_CHECK(o, nb_pipeline_opts, "nb_gpt_pipeline_new", "nb_pipeline_defaults()",
                            "o.n_micro = 8") != NB_OK)
        return NULL;
    nb_pipeline_opts po = o ? *o : nb_pipeline_defaults();
    po.loss = nb__gpt_cross_entropy;
    po.loss_ctx = NULL;
    return nb_pipeline_new(gpt, mesh, layers, 3, &po);
}
