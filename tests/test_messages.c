/* test_messages.c - errors built from an earlier error read as one sentence (issue 31, item
 * 8): the wrapping rule (nb_wrap_error, docs/errors.md "Wrapping an error") and the library's
 * error paths that wrap an inner error. A message is one sentence when no part of it is
 * empty, no run of words repeats (a context said twice: "is corrupt: ... is corrupt"), and it
 * is not cut inside a word. Part of the errors suite. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nabla/checkpoint.h"
#include "testutil.h"

/* Why msg is not one sentence, or NULL when it is. */
static const char *not_one_sentence(const char *msg) {
    static char why[700];
    size_t n = strlen(msg);
    if (n == 0) return "it is empty";
    if (strstr(msg, ":  ") || strstr(msg, ": :") || strstr(msg, "::") || strstr(msg, "  "))
        return "it has an empty part";
    if ((n >= 2 && !strcmp(msg + n - 2, ": ")) || msg[n - 1] == ':' || msg[0] == ':')
        return "it ends or starts with an empty part";
    /* cut inside a word: a long message must say it was cut */
    if (n >= 500 && strcmp(msg + n - 3, "...") != 0) return "it is cut without saying so";
    /* a run of 3 words said twice (punctuation around a word aside) */
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", msg);
    const char *w[200];
    int k = 0;
    for (char *save = NULL, *t = strtok_r(copy, " ", &save); t && k < 200;
         t = strtok_r(NULL, " ", &save)) {
        while (*t && strchr("(\"'", *t)) t++;
        for (size_t e = strlen(t); e > 0 && strchr(":,;.)\"'", t[e - 1]); e--) t[e - 1] = '\0';
        if (*t) w[k++] = t;
    }
    for (int i = 0; i + 2 < k; i++)
        for (int j = i + 1; j + 2 < k; j++)
            if (!strcmp(w[i], w[j]) && !strcmp(w[i + 1], w[j + 1]) &&
                !strcmp(w[i + 2], w[j + 2])) {
                snprintf(why, sizeof why, "\"%s %s %s\" is said twice", w[i], w[i + 1], w[i + 2]);
                return why;
            }
    return NULL;
}

#define ONE_SENTENCE(what)                                                                   \
    do {                                                                                     \
        const char *why_ = not_one_sentence(nb_last_error()); \
        ck_assert_msg(why_ == NULL, "%s: the message is not one sentence (%s): \"%s\"", what, \
                      why_, nb_last_error());                                                \
    } while (0)

/* The garbled messages of the issue, as their callers built them: an error formatted from
 * nb_last_error() (which is the thread's own message buffer). */
START_TEST(test_wrapping_the_last_error) {
    nb_set_error(NB_EFORMAT, "safetensors_open: d/index.safetensors: header length 99 is larger "
                 "than the 3 bytes that follow it (truncated or not a safetensors file?)");
    nb_set_error(NB_EIO, "%s: %s is not a finished tensor-parallel checkpoint (no readable "
                 "index.safetensors): %s", "gpt_tp_load", "d", nb_last_error());
    ck_assert_str_eq(nb_last_error(), "gpt_tp_load: d is not a finished tensor-parallel checkpoint "
                     "(no readable index.safetensors): safetensors_open: d/index.safetensors: "
                     "header length 99 is larger than the 3 bytes that follow it (truncated or "
                     "not a safetensors file?)");
    ck_assert_int_eq(nb_last_status(), NB_EIO);
    ONE_SENTENCE("a truncated index");

    nb_set_error(NB_ETIMEOUT, "allreduce (collective #7 on this communicator) timed out after 2 s "
                 "on rank 0 of 2: rank 1 did not answer within 0.5 s");
    nb_set_error(NB_ETIMEOUT, "zero: gathering the parameters of the unit of %s failed: %s", "h.0",
                 nb_last_error());
    ck_assert_str_eq(nb_last_error(), "zero: gathering the parameters of the unit of h.0 failed: "
                     "allreduce (collective #7 on this communicator) timed out after 2 s on rank "
                     "0 of 2: rank 1 did not answer within 0.5 s");
    ONE_SENTENCE("a failed gather");

    /* the context ends with what the inner message starts with: said once */
    nb_set_error(NB_EFORMAT, "safetensors_verify: d/s1.safetensors is corrupt: the bytes of tensor "
                 "\"w\" hash to 1, the file recorded 2");
    nb_set_error(NB_EFORMAT, "%s: shard %s is corrupt: %s", "gpt_tp_load", "d/s1.safetensors",
                 nb_last_error());
    ck_assert_str_eq(nb_last_error(), "gpt_tp_load: shard d/s1.safetensors is corrupt: the bytes "
                     "of tensor \"w\" hash to 1, the file recorded 2");
    ONE_SENTENCE("a corrupt shard");
    nb_clear_error();
}
END_TEST

START_TEST(test_wrap_rules) {
    /* plain: "<context>: <inner>", the inner status kept with NB_OK */
    nb_set_error(NB_EIO, "module_load: m.st has no tensor \"b\"");
    ck_assert_int_eq(nb_wrap_error(NB_OK, "resume from %s", "m.st"), NB_EIO);
    ck_assert_str_eq(nb_last_error(), "resume from m.st: module_load: m.st has no tensor \"b\"");
    /* the context ends with the inner message's first part (after its op): said once */
    nb_set_error(NB_EIO, "module_load: m.st: no such file");
    nb_wrap_error(NB_OK, "resume from %s", "m.st");
    ck_assert_str_eq(nb_last_error(), "resume from m.st: no such file");
    /* a context with a trailing ": " is the same context */
    nb_set_error(NB_EIO, "x failed");
    nb_wrap_error(NB_EIO, "load: ");
    ck_assert_str_eq(nb_last_error(), "load: x failed");
    /* the same leading op is said once */
    nb_set_error(NB_ECOMM, "zero: the shard of rank 1 is missing");
    nb_wrap_error(NB_ECOMM, "zero: step 3");
    ck_assert_str_eq(nb_last_error(), "zero: step 3: the shard of rank 1 is missing");
    /* an inner message that already starts with the context is kept as it is */
    nb_set_error(NB_ECOMM, "ddp: gradient allreduce failed: timed out");
    nb_wrap_error(NB_ECOMM, "ddp: gradient allreduce failed");
    ck_assert_str_eq(nb_last_error(), "ddp: gradient allreduce failed: timed out");
    /* an empty inner message: its status's description, never an empty part */
    nb_clear_error();
    ck_assert_int_eq(nb_wrap_error(NB_ECOMM, "evaluation"), NB_ECOMM);
    ck_assert_str_eq(nb_last_error(), "evaluation: communication failure");
    nb_clear_error();
    nb_set_error(NB_EIO, "evaluation: %s", nb_last_error()); /* by hand, the same */
    ck_assert_str_eq(nb_last_error(), "evaluation: input/output error");
    /* too long: cut at a word boundary, and it says so */
    char inner[900];
    size_t n = 0;
    while (n + 12 < sizeof inner) n += (size_t)snprintf(inner + n, sizeof inner - n, "word%04zu ", n);
    inner[n - 1] = '\0';
    nb_set_error(NB_EIO, "%s", inner);
    const char *m = nb_last_error();
    size_t len = strlen(m);
    ck_assert_uint_lt(len, 512);
    ck_assert_str_eq(m + len - 3, "...");
    ck_assert_msg(strncmp(m, inner, len - 3) == 0 && inner[len - 3] == ' ',
                  "cut inside a word: \"%s\"", m + len - 20);
    nb_wrap_error(NB_EIO, "context");
    m = nb_last_error();
    len = strlen(m);
    ck_assert_uint_lt(len, 512);
    ck_assert_str_eq(m + len - 3, "...");
    ck_assert_msg(m[len - 4] != ' ' && strncmp(m, "context: word0000 ", 18) == 0, "\"%s\"", m);
    ONE_SENTENCE("a long message");
    nb_clear_error();
}
END_TEST

/* The library's own wrapping error paths. */
START_TEST(test_wrapped_paths) {
    char dir[] = "/tmp/nb_messages_XXXXXX";
    ck_assert(mkdtemp(dir) != NULL);
    char path[128], opath[128];
    snprintf(path, sizeof path, "%s/run.ckpt", dir);
    snprintf(opath, sizeof opath, "%s/model.safetensors", dir);
    nb_scope_begin();
    nb_generator *g = nb_generator_new(1);
    nb_linear_opts lo = nb_linear_defaults();
    lo.gen = g;
    nb_module *m = nb_linear_new(4, 3, &lo);
    nb_optim *opt = nb_adamw_new(nb_parameters(m), NULL);
    ck_assert(m && opt);
    nb_checkpoint ck = {.model = m, .optim = opt, .step = 3};
    ck_assert_int_eq(nb_checkpoint_save(path, &ck), NB_OK);
    ck_assert_int_eq(nb_module_save(m, opath), NB_OK);

    /* a checkpoint cut short, and one with a flipped byte */
    ck_assert(truncate(path, 100) == 0);
    ck_assert_int_ne(nb_checkpoint_load(path, &ck), NB_OK);
    ONE_SENTENCE("a truncated checkpoint");
    ck_assert_int_eq(nb_checkpoint_save(path, &ck), NB_OK);
    FILE *f = fopen(path, "r+b");
    ck_assert(f != NULL);
    fseek(f, -3, SEEK_END);
    int c = fgetc(f);
    fseek(f, -3, SEEK_END);
    fputc(c ^ 0x5a, f);
    fclose(f);
    ck_assert_int_eq(nb_checkpoint_load(path, &ck), NB_EFORMAT);
    ONE_SENTENCE("a corrupt checkpoint");
    ck_assert_ptr_null(strstr(strstr(nb_last_error(), "corrupt") + 1, "corrupt"));

    /* a model file cut short */
    ck_assert(truncate(opath, 60) == 0);
    ck_assert_int_ne(nb_module_load(m, opath, true), NB_OK);
    ONE_SENTENCE("a truncated model file");

    /* optimizer state whose entry cannot be used (optim/state.c's wrapped entry error) */
    const char *names[] = {"step"};
    nb_tensor *bad[] = {nb_zeros((int64_t[]){2, 2}, 2, NB_F32)};
    ck_assert_int_ne(nb_optim_load_state(opt, names, bad, 1), NB_OK);
    ONE_SENTENCE("a bad optimizer state entry");

    /* a module moved to a device that is not there */
    nb_device cuda;
    ck_assert_int_eq(nb_device_parse("cuda:7", &cuda), NB_OK);
    if (nb_module_to(m, cuda) != NB_OK) ONE_SENTENCE("module_to an absent GPU");

    nb_optim_free(opt);
    nb_module_free(m);
    nb_generator_free(g);
    nb_scope_end();
    nb_clear_error();
    unlink(path);
    rmdir(dir);
}
END_TEST

TCase *nb_tcase_messages(void) {
    TCase *tc = tcase_create("messages");
    tcase_add_test(tc, test_wrapping_the_last_error);
    tcase_add_test(tc, test_wrap_rules);
    tcase_add_test(tc, test_wrapped_paths);
    return tc;
}
