/* fuzz_gpt.c - the GPT's weight-file reader on arbitrary bytes, as an embedding program uses
 * it (models/gpt/gpt_sample.c): nb_gpt_config_from_file infers the model's sizes from the
 * file's shapes (nabla's names, or a nanoGPT state dict with its prefixes), then, when the
 * sizes are small enough for a fuzzer, nb_gpt_new and nb_gpt_load (strict about names and
 * shapes) and a generation of a few tokens from the loaded weights. */
#include "fuzz.h"
#include "nabla/gpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_file(data, size, path, sizeof path);
    nb_gpt_config cfg = nb_gpt_config_defaults();
    if (nb_gpt_config_from_file(path, &cfg) == NB_OK) {
        FUZZ_CHECK(cfg.n_layer > 0);
        /* one head: any n_embd divides; sizes a fuzzer can afford */
        cfg.n_head = 1;
        bool small = cfg.vocab_size > 0 && cfg.vocab_size <= 512 && cfg.n_embd > 0 &&
                     cfg.n_embd <= 64 && cfg.block_size > 0 && cfg.block_size <= 64 &&
                     cfg.n_layer <= 4;
        nb_module *m = small ? nb_gpt_new(&cfg, NULL) : NULL;
        if (m && nb_gpt_load(m, path) == NB_OK) {
            int64_t prompt[2] = {0, cfg.vocab_size - 1}, out[3];
            nb_gpt_sample_opts so = nb_gpt_sample_defaults(); /* greedy */
            FUZZ_CHECK(nb_gpt_generate(m, prompt, 2, 3, &so, out) == NB_OK);
            for (int i = 0; i < 3; i++) FUZZ_CHECK(out[i] >= 0 && out[i] < cfg.vocab_size);
        }
        nb_module_free(m);
    }
    close(fd);
    nb_clear_error();
    return 0;
}
