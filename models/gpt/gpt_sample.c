/* gpt_sample.c - embedding a GPT in a C application: load a trained GPT (or build a small
 * one from a config) and sample tokens from it, with nothing but the installed library:
 *
 *     cc gpt_sample.c -o gpt_sample $(pkg-config --cflags --libs nabla)
 *     ./gpt_sample --load model.safetensors --n-head 4 --prompt 10,20 --tokens 8 --seed 1
 *     ./gpt_sample --temperature 0.8 --top-k 40      # a new (untrained) model, seed 0
 *
 * --load takes a model file (nb_module_save), a checkpoint of the `gpt` program, or a
 * nanoGPT state dict saved as safetensors; the shapes give the size, --n-head the one
 * thing they cannot tell. --prompt is comma-separated token ids (default 0); the program
 * prints the generated token ids on one line. Temperature 0 is greedy (argmax).
 * Exit status: 0 done, 1 an error (the library's message on stderr), 2 bad arguments. */
#include <nabla/nabla.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PROMPT 256

static int usage(const char *why) {
    fprintf(stderr, "gpt_sample: %s\n"
                    "usage: gpt_sample [--load FILE --n-head N] [--prompt ID,ID,...] "
                    "[--tokens N] [--temperature X] [--top-k K] [--seed N]\n", why);
    return 2;
}

/* A whole-string number, or false. */
static bool parse_i64(const char *s, long long *v) {
    char *end;
    *v = strtoll(s, &end, 10);
    return *s && !*end;
}

static bool parse_f64(const char *s, double *v) {
    char *end;
    *v = strtod(s, &end);
    return *s && !*end;
}

int main(int argc, char **argv) {
    const char *load = NULL, *prompt_text = "0";
    long long n_head = 0, tokens = 16, top_k = 0, seed = 0;
    double temperature = 0;
    static const char *const flags[] = {"--load", "--prompt", "--n-head", "--tokens", "--top-k",
                                        "--seed", "--temperature"};
    bool seen[sizeof flags / sizeof flags[0]] = {false};
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = val != NULL;
        for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++)
            if (strcmp(flag, flags[k]) == 0) {
                char why[80];
                snprintf(why, sizeof why, "%s is given more than once; give each flag once", flag);
                if (seen[k]) return usage(why);
                seen[k] = true;
            }
        if (ok && strcmp(flag, "--load") == 0) load = val;
        else if (ok && strcmp(flag, "--prompt") == 0) prompt_text = val;
        else if (ok && strcmp(flag, "--n-head") == 0) ok = parse_i64(val, &n_head) && n_head > 0;
        else if (ok && strcmp(flag, "--tokens") == 0) ok = parse_i64(val, &tokens) && tokens >= 0;
        else if (ok && strcmp(flag, "--top-k") == 0) ok = parse_i64(val, &top_k) && top_k >= 0;
        else if (ok && strcmp(flag, "--seed") == 0) ok = parse_i64(val, &seed) && seed >= 0;
        else if (ok && strcmp(flag, "--temperature") == 0)
            ok = parse_f64(val, &temperature) && temperature >= 0;
        else return usage(val ? "unknown flag" : "a flag without its value");
        if (!ok) return usage("a flag's value is not a valid number");
        i++;
    }
    if (load && !n_head) return usage("--load needs --n-head (the shapes do not tell it)");

    int64_t prompt[MAX_PROMPT];
    int64_t n_prompt = 0;
    for (const char *p = prompt_text; *p;) {
        char *end;
        long long t = strtoll(p, &end, 10);
        if (end == p || (*end && *end != ',') || n_prompt == MAX_PROMPT)
            return usage("--prompt takes up to 256 comma-separated token ids");
        prompt[n_prompt++] = t;
        p = *end ? end + 1 : end;
    }
    if (n_prompt == 0) return usage("--prompt is empty");

    /* The model: its config from the file's shapes, or a small one drawn from the seed. */
    nb_gpt_config cfg = nb_gpt_config_defaults();
    cfg.n_head = n_head;
    nb_module *model = NULL;
    if (load) {
        if (nb_gpt_config_from_file(load, &cfg) == NB_OK && (model = nb_gpt_new(&cfg, NULL)) &&
            nb_gpt_load(model, load) != NB_OK) {
            nb_module_free(model);
            model = NULL;
        }
    } else {
        cfg.vocab_size = 64, cfg.block_size = 16, cfg.n_layer = 2, cfg.n_head = 2;
        cfg.n_embd = 32;
        nb_generator *init = nb_generator_new((uint64_t)seed);
        if (init) model = nb_gpt_new(&cfg, init);
        nb_generator_free(init);
    }
    if (!model) {
        fprintf(stderr, "gpt_sample: %s\n", nb_last_error());
        return 1;
    }

    /* Sampling draws from its own generator, so the same seed gives the same tokens. */
    nb_generator *gen = nb_generator_new((uint64_t)seed);
    int64_t *out = malloc(sizeof(int64_t) * (size_t)(tokens > 0 ? tokens : 1));
    nb_gpt_sample_opts so = nb_gpt_sample_defaults();
    so.temperature = temperature, so.top_k = top_k, so.gen = gen;
    nb_status st = !gen || !out ? NB_ENOMEM
                                : nb_gpt_generate(model, prompt, n_prompt, tokens, &so, out);
    if (st == NB_OK) {
        for (long long i = 0; i < tokens; i++) printf("%s%lld", i ? " " : "", (long long)out[i]);
        printf("\n");
    } else {
        fprintf(stderr, "gpt_sample: %s\n", gen && out ? nb_last_error() : "out of memory");
    }
    free(out);
    nb_generator_free(gen);
    nb_module_free(model);
    return st == NB_OK ? 0 : 1;
}
