/* llama_parallel.c - the Llama's parallel-specific code (nabla/llama.h): its tensor-parallel
 * plan (Megatron-LM's layout, with sequence parallelism) and its pipeline split. Everything
 * else is the one model of zoo/llama.c and the generic parallel layer. */
#include "nabla/nabla.h"
#include "zoo/llama_impl.h"

/* q, k, v, gate and up column-wise (whole heads; with fewer key/value heads than ranks each
 * k/v head is held by the tp / n_kv_head ranks of its query heads), o and down row-wise, the
 * vocabulary split in the embedding and the head (whose output feeds the vocab-parallel cross
 * entropy), and with sequence parallelism the RMSNorms on sequence shards. */
nb_status nb_llama_parallelize(nb_module *llama, const nb_mesh *mesh, const nb_parallelize_opts *o) {
    const nb_llama_config *c = nb_llama_get_config(llama);
    if (!c) return nb_set_error(NB_EINVAL, "nb_llama_parallelize: the module is not a Llama");
    if (o && NB__OPTS_CHECK(o, nb_parallelize_opts, "nb_llama_parallelize",
                            "nb_parallelize_defaults()", "o.sequence_parallel = true") != NB_OK)
        return nb_last_status();
    const int tp = nb_mesh_size(mesh, o && o->tp_dim ? o->tp_dim : "tp");
    if (tp < 1) return nb_last_status();
    if (c->n_head % tp || (c->n_kv_head % tp && tp % c->n_kv_head))
        return nb_set_error(NB_EINVAL, "nb_llama_parallelize: the tensor-parallel size %d must "
                            "divide n_head (%lld), and divide n_kv_head (%lld) or be a multiple "
                            "of it: each rank holds whole query heads and the key/value heads "
                            "they read (split over the ranks, or each held by tp / n_kv_head "
                            "ranks)", tp, (long long)c->n_head, (long long)c->n_kv_head);
    if (o && o->sequence_parallel && c->block_size % tp)
        return nb_set_error(NB_EINVAL, "nb_llama_parallelize: with sequence parallelism the "
                            "context (block_size %lld) must divide by the tensor-parallel size %d "
                            "(each rank holds an equal part of every sequence)",
                            (long long)c->block_size, tp);
    const int64_t hd = c->n_embd / c->n_head; /* a rank holds whole heads */
    const nb_tp_rule plan[] = {
        {"model.embed_tokens", NB_TP_VOCAB},
        {"model.layers.*.input_layernorm", NB_TP_SEQUENCE},
        {"model.layers.*.self_attn.q_proj", NB_TP_COLWISE, 0, hd},
        {"model.layers.*.self_attn.k_proj", NB_TP_COLWISE, 0, hd},
        {"model.layers.*.self_attn.v_proj", NB_TP_COLWISE, 0, hd},
        {"model.layers.*.self_attn.o_proj", NB_TP_ROWWISE, 0, hd},
        {"model.layers.*.post_attention_layernorm", NB_TP_SEQUENCE},
        {"model.layers.*.mlp.gate_proj", NB_TP_COLWISE},
        {"model.layers.*.mlp.up_proj", NB_TP_COLWISE},
        {"model.layers.*.mlp.down_proj", NB_TP_ROWWISE},
        {"model.norm", NB_TP_SEQUENCE},
        {"lm_head", NB_TP_COLWISE},
        {0}};
    return nb_parallelize(llama, mesh, plan, o);
}

/* The layers: the embedding, each decoder layer, the head; the loss on the last stage. */
nb_pipeline *nb_llama_pipeline_new(nb_module *llama, const nb_mesh *mesh,
                                   const nb_pipeline_opts *o) {
    if (!nb_llama_get_config(llama)) {
        nb_set_error(NB_EINVAL, "nb_llama_pipeline_new: the module is not a Llama");
        return NULL;
    }
    const nb_pipe_layer layers[] = {{"model.embed_tokens", nb__llama_embed, NULL, true},
                                    {"model.layers.*", NULL, NULL, false},
                                    {"model.norm lm_head", nb__llama_head, NULL, true}};
    if (o && NB__OPTS_CHECK(o, nb_pipeline_opts, "nb_llama_pipeline_new", "nb_pipeline_defaults()",
                            "o.n_micro = 8") != NB_OK)
        return NULL;
    nb_pipeline_opts po = o ? *o : nb_pipeline_defaults();
    po.loss = nb__llama_cross_entropy;
    po.loss_ctx = NULL;
    return nb_pipeline_new(llama, mesh, layers, 3, &po);
}
