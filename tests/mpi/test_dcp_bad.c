/* test_dcp_bad.c - bad checkpoints refused with nothing changed, in nabla_mpi_tests (1, 2 and
 * 4 ranks, and alone): the corruption matrix (a flipped byte, a file of another run, rank
 * files swapped, a missing or truncated file, an index without files, files without an index,
 * another program's checkpoint, overlapping or gappy pieces (also a piece moved onto another,
 * which keeps the element count), a dtype or shape that disagrees,
 * an index whose checksum disagrees with its file) x every layout kind of dcp_layouts.h; each
 * is refused on every rank with the expected message, and every rank's state (parameters,
 * optimizer, schedule) is byte for byte what it was. With verification off
 * (NB_TEST_NO_VERIFY=1) the flipped byte loads: the checksums are what refuses it. And a load
 * that fails while applying (an optimizer that does not match, on one rank only) leaves every
 * rank as it was. Rank 0 prints the matrix. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dcp_layouts.h"

/* The corruptions, done by a small Python script on rank 0 (the index is JSON). */
typedef struct corruption {
    const char *name;
    const char *expect;     /* in the error message */
    const char *expect_plain;
    bool folder_only;
} corruption;

static const corruption corruptions[] = {
    {"flip", "corrupt", "corrupt", false},
    {"other_run", "another run", "belongs to run", false},
    {"swap", "swapped", NULL, true},
    {"missing", "missing", "cannot open", false},
    {"truncate", "truncated", "truncated", false},
    {"nofiles", "missing", NULL, true},
    {"noindex", "no index.json", NULL, true},
    {"program", "was written by", "was written by", false},
    {"overlap", "overlap", NULL, true},
    {"moved", "overlap", NULL, true},
    {"gap", "a gap", NULL, true},
    {"dtype", "does not match", NULL, true},
    {"shape", "shape", NULL, true},
    {"checksum", "does not match", NULL, true},
};
enum { NC = sizeof corruptions / sizeof *corruptions };

static const char script[] =
    "import json, os, shutil, sys\n"
    "kind, path, other = sys.argv[1], sys.argv[2], sys.argv[3]\n"
    "folder = os.path.isdir(path)\n"
    "def flip(p):\n"
    "    b = bytearray(open(p, 'rb').read()); b[-5] ^= 1; open(p, 'wb').write(b)\n"
    "if not folder:\n"
    "    if kind == 'flip': flip(path)\n"
    "    elif kind == 'other_run': shutil.copy(other, path)\n"
    "    elif kind == 'missing': os.remove(path)\n"
    "    elif kind == 'truncate': os.truncate(path, os.path.getsize(path) // 2)\n"
    "    sys.exit(0)\n"
    "ip = os.path.join(path, 'index.json')\n"
    "idx = json.load(open(ip))\n"
    "files = [os.path.join(path, f['name']) for f in idx['files']]\n"
    "def save(): json.dump(idx, open(ip, 'w'))\n"
    "ts = idx['tensors']\n"
    "if kind == 'flip': flip(files[0])\n"
    "elif kind == 'other_run':\n"
    "    o = json.load(open(os.path.join(other, 'index.json')))\n"
    "    r = idx['files'][0]['rank']\n"
    "    src = [f['name'] for f in o['files'] if f['rank'] == r][0]\n"
    "    shutil.copy(os.path.join(other, src), files[0])\n"
    "elif kind == 'swap':\n"
    "    if len(files) < 2: sys.exit(3)\n"
    "    os.rename(files[0], files[0] + '.x'); os.rename(files[1], files[0]);\n"
    "    os.rename(files[0] + '.x', files[1])\n"
    "elif kind == 'missing': os.remove(files[0])\n"
    "elif kind == 'truncate': os.truncate(files[0], os.path.getsize(files[0]) // 2)\n"
    "elif kind == 'nofiles': [os.remove(f) for f in files]\n"
    "elif kind == 'noindex': os.remove(ip)\n"
    "elif kind == 'overlap':\n"
    "    t = ts[sorted(ts)[0]]; t['pieces'].append(dict(t['pieces'][0])); save()\n"
    "elif kind == 'moved':\n"
    "    vol = lambda p: p['flat'][1] if 'flat' in p else __import__('math').prod(p['size'])\n"
    "    hit = [(t, i, j) for n, t in sorted(ts.items()) for i in range(len(t['pieces']))\n"
    "           for j in range(i + 1, len(t['pieces'])) if vol(t['pieces'][i]) > 0 and\n"
    "           vol(t['pieces'][i]) == vol(t['pieces'][j])]\n"
    "    if not hit: sys.exit(3)\n"
    "    t, i, j = hit[0]; t['pieces'][j] = dict(t['pieces'][i]); save()\n"
    "elif kind == 'gap':\n"
    "    many = [n for n in sorted(ts) if len(ts[n]['pieces']) > 1]\n"
    "    if not many: sys.exit(3)\n"
    "    ts[many[0]]['pieces'].pop(); save()\n"
    "elif kind == 'dtype':\n"
    "    n = [n for n in sorted(ts) if ts[n]['dtype'] == 'F32'][0]; ts[n]['dtype'] = 'F64'; save()\n"
    "elif kind == 'shape':\n"
    "    t = ts['model.0.weight']; t['shape'] = t['shape'][::-1]\n"
    "    for p in t['pieces']: p['offset'] = p['offset'][::-1]; p['size'] = p['size'][::-1]\n"
    "    save()\n"
    "elif kind == 'checksum':\n"
    "    p = ts[sorted(ts)[0]]['pieces'][0]; c = p['checksum']\n"
    "    p['checksum'] = c[:-1] + ('0' if c[-1] != '0' else '1'); save()\n";

/* Restore good from its backup and apply kind to it (rank 0); the same answer on every rank:
 * 0 done, 3 not applicable, else failed. */
static int corrupt(const char *tmp, const char *good, const char *other, const char *kind) {
    int rc = 0;
    if (mt_rank == 0) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s.bak' '%s' && python3 '%s/c.py' %s "
                 "'%s' '%s'", good, good, good, tmp, kind, good, other);
        rc = system(cmd);
        rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : 1;
    }
    nb_scope_begin();
    nb_tensor *t = nb_scalar(rc, NB_I32);
    MT_OK(nb_broadcast(mt_world, t, 0));
    rc = (int)nb_item_i64(t);
    nb_scope_end();
    return rc;
}

START_TEST(test_dcp_corruption_matrix) {
    static const dcp_kind_t kinds[] = {L_ONE, L_DDP, L_Z1, L_Z3, L_TP, L_TPB, L_FLAT, L_TPFLAT};
    enum { NK = sizeof kinds / sizeof *kinds };
    nb_scope_begin();
    char tmp[64], ref[128], good[128], other[128];
    mt_tmpdir(tmp, "nb-dcp");
    if (mt_rank == 0) {
        char p[128];
        snprintf(p, sizeof p, "%s/c.py", tmp);
        FILE *f = fopen(p, "w");
        MT_CHECK(f && fputs(script, f) >= 0, "writing %s", p);
        if (f) fclose(f);
    }
    snprintf(ref, sizeof ref, "%s/ref.ckpt", tmp);
    { /* the trained state every layout starts from */
        dcp_layout r;
        dcp_layout_build(&r, L_ONE, 7);
        for (int i = 0; i < 2; i++) dcp_layout_train(&r, i);
        nb_checkpoint ck = dcp_layout_ck(&r, 2);
        if (r.active) MT_OK(nb_checkpoint_save(ref, &ck));
        dcp_layout_free(&r);
    }
    int tried[NK][NC] = {{0}}, refused[NK][NC] = {{0}};
    for (int k = 0; k < NK; k++) {
        const char *lname = dcp_layout_names[kinds[k]];
        snprintf(good, sizeof good, "%s/good%d.ckpt", tmp, k);
        snprintf(other, sizeof other, "%s/other%d.ckpt", tmp, k);
        dcp_layout l;
        dcp_layout_build(&l, kinds[k], 21);
        nb_checkpoint ck = dcp_layout_ck(&l, 0);
        bool folder = kinds[k] != L_ONE && kinds[k] != L_DDP;
        char run[33] = "";
        if (l.active) {
            MT_OK(nb_checkpoint_load(ref, &ck));
            snprintf(run, sizeof run, "%s", ck.run_id);
            MT_OK(nb_checkpoint_save(good, &ck));
            nb_checkpoint ok = ck; /* the same state under another run id */
            snprintf(ok.run_id, sizeof ok.run_id, "%s", "ffffffffffffffffffffffffffffffff");
            MT_OK(nb_checkpoint_save(other, &ok));
        }
        mt_barrier();
        struct stat sb;
        folder = stat(good, &sb) == 0 && S_ISDIR(sb.st_mode); /* one rank: always a file */
        if (mt_rank == 0) {
            char cmd[512];
            snprintf(cmd, sizeof cmd, "cp -r '%s' '%s.bak'", good, good);
            MT_CHECK(system(cmd) == 0, "%s", cmd);
        }
        for (int c = 0; c < NC; c++) {
            const corruption *cr = &corruptions[c];
            if (!folder && cr->folder_only) continue;
            int rc = corrupt(tmp, good, other, cr->name);
            if (rc == 3) continue; /* not applicable here (one file, one piece) */
            MT_CHECK(rc == 0, "%s: corrupting (%s) failed", lname, cr->name);
            tried[k][c] = 1;
            if (!l.active) continue;
            size_t n0, n1;
            unsigned char *before = dcp_layout_bytes(&l, &n0);
            nb_checkpoint lc = dcp_layout_ck(&l, 0);
            snprintf(lc.run_id, sizeof lc.run_id, "%s", run);
            if (!strcmp(cr->name, "program")) lc.program = "other";
            nb_status st = nb_checkpoint_load(good, &lc);
            const char *want = folder ? cr->expect : cr->expect_plain;
            bool ok = st != NB_OK && strstr(nb_last_error(), want) != NULL;
            MT_CHECK(ok, "%s, %s: got %s \"%s\", expected a refusal with \"%s\"", lname, cr->name,
                     nb_status_name(st), nb_last_error(), want);
            nb_clear_error();
            unsigned char *after = dcp_layout_bytes(&l, &n1);
            bool same = n0 == n1 && memcmp(before, after, n0) == 0;
            MT_CHECK(same, "%s, %s: the refused load changed the state", lname, cr->name);
            refused[k][c] = ok && same;
            free(before);
            free(after);
            if (!strcmp(cr->name, "flip")) { /* the check can fail: without it, it loads */
                setenv("NB_TEST_NO_VERIFY", "1", 1);
                lc.program = "test";
                st = nb_checkpoint_load(good, &lc);
                unsetenv("NB_TEST_NO_VERIFY");
                MT_CHECK(st == NB_OK, "%s: with verification off the flipped byte should load, "
                         "got \"%s\"", lname, nb_last_error());
                nb_clear_error();
            }
        }
        /* the pristine checkpoint still loads */
        corrupt(tmp, good, other, "none");
        if (l.active) {
            nb_checkpoint lc = dcp_layout_ck(&l, 0);
            MT_OK(nb_checkpoint_load(good, &lc));
        }
        dcp_layout_free(&l);
        mt_barrier();
    }
    if (mt_rank == 0 && mt_size == 4) { /* the matrix, for the record */
        printf("corruption matrix (%d ranks): refused/tried\n%-30s", mt_size, "");
        for (int c = 0; c < NC; c++) printf(" %-9.9s", corruptions[c].name);
        printf("\n");
        for (int k = 0; k < NK; k++) {
            printf("%-30s", dcp_layout_names[kinds[k]]);
            for (int c = 0; c < NC; c++)
                printf(" %-9s", tried[k][c] ? refused[k][c] ? "refused" : "LOADED" : "-");
            printf("\n");
        }
    }
    mt_barrier();
    if (mt_rank == 0) mt_rmtree(tmp);
    nb_scope_end();
    MT_END();
}
END_TEST

/* A load that fails while it is applied, on one rank only (its optimizer has one group where
 * the checkpoint has two): every rank's optimizer and schedule are restored, no model
 * changed. */
START_TEST(test_dcp_all_or_nothing) {
    nb_scope_begin();
    char tmp[64], path[128];
    mt_tmpdir(tmp, "nb-dcp");
    snprintf(path, sizeof path, "%s/ddp.ckpt", tmp);
    dcp_layout a;
    dcp_layout_build(&a, L_DDP, 7);
    dcp_layout_train(&a, 0);
    nb_checkpoint ck = dcp_layout_ck(&a, 1);
    MT_OK(nb_checkpoint_save(path, &ck));
    dcp_layout b;
    dcp_layout_build(&b, L_DDP, 9);
    dcp_layout_train(&b, 5); /* state of its own */
    if (mt_rank == mt_size - 1) { /* this rank's optimizer: one group */
        nb_sched_free(b.s);
        nb_optim_free(b.o);
        nb_adamw_opts ao = nb_adamw_defaults();
        b.o = b.inner = nb_adamw_new(nb_parameters(b.m), &ao);
        nb_sched_opts so = nb_sched_defaults(NB_SCHED_COSINE);
        so.total_steps = 40;
        b.s = nb_sched_new(b.o, &so);
    }
    size_t n0, n1;
    unsigned char *before = dcp_layout_bytes(&b, &n0);
    nb_checkpoint lc = dcp_layout_ck(&b, 0);
    nb_status st = nb_checkpoint_load(path, &lc);
    MT_CHECK(st != NB_OK, "a load into a mismatched optimizer succeeded");
    MT_CHECK(mt_size == 1 || strstr(nb_last_error(), "(on rank") || mt_rank == mt_size - 1,
             "the other ranks' error does not name the rank: %s", nb_last_error());
    nb_clear_error();
    unsigned char *after = dcp_layout_bytes(&b, &n1);
    MT_CHECK(n0 == n1 && memcmp(before, after, n0) == 0, "a failed load changed this rank");
    MT_CHECK(lc.step == 0, "step changed to %lld", (long long)lc.step);
    free(before);
    free(after);
    dcp_layout_free(&a);
    dcp_layout_free(&b);
    mt_barrier();
    if (mt_rank == 0) mt_rmtree(tmp);
    nb_scope_end();
    MT_END();
}
END_TEST

Suite *mt_suite_dcp_bad(void) {
    Suite *s = suite_create("dcp_bad");
    TCase *tc = tcase_create("dcp_bad");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_dcp_corruption_matrix);
    tcase_add_test(tc, test_dcp_all_or_nothing);
    suite_add_tcase(s, tc);
    return s;
}
