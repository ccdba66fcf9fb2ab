/* test_data_transforms.c - the data suite's tests of the image transforms, the byte-level text
 * helpers, and the loader and transforms on other devices (their batches equal the CPU's);
 * added to the suite's TCase by nb_tests_data_transforms (tests/test_data.c). */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "test_data.h"
#include "testutil.h"

/* ---- transforms ------------------------------------------------------------------------------- */
static nb_batch make_batch(nb_tensor *x, const int64_t *ids, int64_t epoch, uint64_t seed) {
    return (nb_batch){.x = x, .indices = ids, .n = nb_shape(x)[0], .epoch = epoch,
                      .seed = seed};
}

/* (N, C, H, W) with values distinct and nonzero within every plane (exact in u8, bf16); a
 * host batch, as the loader's are (transforms run on the host). */
enum { TN = 40, TC = 3, TH = 5, TW = 7, TP = TH * TW };
static nb_tensor *plane_tensor(nb_dtype dt, double *v) {
    for (int k = 0; k < TN; k++)
        for (int c = 0; c < TC; c++)
            for (int e = 0; e < TP; e++)
                v[(k * TC + c) * TP + e] = (double)((k * 11 + c * 37 + e) % 250 + 1);
    return on_host(tu_tensor(v, (int64_t[]){TN, TC, TH, TW}, 4, dt));
}

/* Does plane q equal plane p shifted by (sy, sx) with zeros outside? */
static bool is_shift(const double *p, const double *q, int sy, int sx) {
    for (int i = 0; i < TH; i++)
        for (int j = 0; j < TW; j++) {
            int si = i + sy, sj = j + sx;
            double want = si >= 0 && si < TH && sj >= 0 && sj < TW ? p[si * TW + sj] : 0;
            if (q[i * TW + j] != want) return false;
        }
    return true;
}

START_TEST(test_transforms) {
    nb_scope_begin();
    const nb_dtype dts[] = {NB_F32, NB_F64, NB_U8, NB_BF16};
    const int64_t shape[4] = {TN, TC, TH, TW};
    static double v[TN * TC * TP], ref[TN * TC * TP];
    int64_t ids[TN], rev[TN];
    for (int i = 0; i < TN; i++) ids[i] = 100 + i, rev[i] = 100 + TN - 1 - i;
    for (int di = 0; di < 4; di++) {
        nb_dtype dt = dts[di];
        /* Flip with p = 1 reverses every row; twice is the identity; p = 0 does nothing. */
        nb_tensor *x = plane_tensor(dt, v);
        nb_batch b = make_batch(x, ids, 0, 1);
        ck_assert(nb_random_hflip(&b, 1.0) == NB_OK);
        for (int r = 0; r < TN * TC * TH; r++)
            for (int j = 0; j < TW; j++) ref[r * TW + j] = v[r * TW + TW - 1 - j];
        tu_assert_close(x, ref, shape, 4, 0.0);
        ck_assert(nb_random_hflip(&b, 1.0) == NB_OK);
        tu_assert_close(x, v, shape, 4, 0.0);
        ck_assert(nb_random_hflip(&b, 0.0) == NB_OK);
        tu_assert_close(x, v, shape, 4, 0.0);
        /* p = 0.5: some samples flip, chosen by (seed, epoch, index) alone. */
        ck_assert(nb_random_hflip(&b, 0.5) == NB_OK);
        double *out = tu_values(x);
        int flipped = 0;
        bool fl[TN];
        for (int k = 0; k < TN; k++) {
            fl[k] = out[k * TC * TP] != v[k * TC * TP];
            flipped += fl[k];
        }
        ck_assert(flipped > 5 && flipped < 35);
        nb_tensor *xr = plane_tensor(dt, v); /* the same samples in reverse batch order */
        nb_tensor *xrr = nb_contiguous(nb_index_select(xr, 0, on_host(nb_arange(TN - 1, -1, -1,
                                                                                NB_I64))));
        nb_batch br = make_batch(xrr, rev, 0, 1);
        ck_assert(nb_random_hflip(&br, 0.5) == NB_OK);
        double *outr = tu_values(xrr);
        for (int k = 0; k < TN; k++)
            ck_assert(memcmp(outr + (TN - 1 - k) * TC * TP, out + k * TC * TP,
                             sizeof(double) * TC * TP) == 0);
        free(outr);
        nb_tensor *xe = plane_tensor(dt, v);
        nb_batch be = make_batch(xe, ids, 1, 1); /* another epoch: another pattern */
        ck_assert(nb_random_hflip(&be, 0.5) == NB_OK);
        double *oute = tu_values(xe);
        int diff = 0;
        for (int k = 0; k < TN; k++) diff += (oute[k * TC * TP] != v[k * TC * TP]) != fl[k];
        ck_assert(diff > 0);
        free(oute);
        free(out);

        /* Crop: padding 0 is the identity; padding 2 shifts each sample (all channels
         * alike) by some (sy, sx) in [-2, 2]^2 with zeros coming in. */
        x = plane_tensor(dt, v);
        b = make_batch(x, ids, 3, 9);
        ck_assert(nb_random_crop(&b, 0) == NB_OK);
        tu_assert_close(x, v, shape, 4, 0.0);
        ck_assert(nb_random_crop(&b, 2) == NB_OK);
        out = tu_values(x);
        int used[5][5] = {{0}};
        for (int k = 0; k < TN; k++) {
            int matches = 0;
            for (int sy = -2; sy <= 2; sy++)
                for (int sx = -2; sx <= 2; sx++) {
                    bool all = true;
                    for (int c = 0; c < TC; c++)
                        all = all && is_shift(v + (k * TC + c) * TP, out + (k * TC + c) * TP,
                                              sy, sx);
                    if (all) matches++, used[sy + 2][sx + 2]++;
                }
            ck_assert_msg(matches == 1, "sample %d matches %d shifts", k, matches);
        }
        int kinds = 0;
        for (int i = 0; i < 25; i++) kinds += used[i / 5][i % 5] > 0;
        ck_assert(kinds >= 8);
        free(out);
        /* Padding larger than the image: still some shift, possibly all zeros. */
        x = plane_tensor(dt, v);
        b = make_batch(x, ids, 0, 2);
        ck_assert(nb_random_crop(&b, 9) == NB_OK);
        /* (N, H, W) batches work too. */
        nb_tensor *x3 = nb_view(plane_tensor(dt, v), (int64_t[]){TN * TC, TH, TW}, 3);
        int64_t ids3[TN * TC];
        for (int i = 0; i < TN * TC; i++) ids3[i] = i;
        nb_batch b3 = make_batch(x3, ids3, 0, 2);
        ck_assert(nb_random_hflip(&b3, 1.0) == NB_OK && nb_random_crop(&b3, 1) == NB_OK);
    }
    /* Normalize per channel, and with one value for all channels. */
    const nb_dtype fdts[] = {NB_F32, NB_F64, NB_BF16};
    for (int di = 0; di < 3; di++) {
        for (int one = 0; one < 2; one++) {
            nb_tensor *x = plane_tensor(fdts[di], v);
            const double mean[3] = {1, 2, 3}, std[3] = {2, 4, 8};
            ck_assert(nb_normalize_(x, mean, std, one ? 1 : 3) == NB_OK);
            for (int i = 0; i < TN * TC * TP; i++) {
                int c = one ? 0 : (i / TP) % TC;
                ref[i] = (v[i] - mean[c]) / std[c];
            }
            tu_assert_close(x, ref, shape, 4, tu_tol(fdts[di]));
        }
    }
    nb_tensor *x = plane_tensor(NB_F32, v);
    const double m3[3] = {0, 0, 0}, s3[3] = {1, 0, 1};
    tu_assert_error(nb_normalize_(x, m3, s3, 2) ? NULL : (void *)1, NB_ESHAPE, "3 channels");
    tu_assert_error(nb_normalize_(x, m3, s3, 3) ? NULL : (void *)1, NB_EINVAL, "std[1]");
    tu_assert_error(nb_normalize_(plane_tensor(NB_U8, v), m3, m3, 1) ? NULL : (void *)1,
                    NB_EDTYPE, "u8");
    tu_assert_error(nb_normalize_(nb_transpose(x, 2, 3), m3, s3, 1) ? NULL : (void *)1,
                    NB_EINVAL, "contiguous");
    tu_assert_error(nb_normalize_(nb_zeros_on(NB_CPU, (int64_t[]){3}, 1, NB_F32), m3, s3, 1)
                        ? NULL : (void *)1, NB_EDIM, "[3]");
    tu_assert_error(nb_normalize_(NULL, m3, s3, 1) ? NULL : (void *)1, NB_ENULL, "x");
    /* Batch errors. */
    nb_batch b = make_batch(x, ids, 0, 0);
    tu_assert_error(nb_random_hflip(&b, 1.5) ? NULL : (void *)1, NB_EINVAL, "1.5");
    tu_assert_error(nb_random_crop(&b, -1) ? NULL : (void *)1, NB_EINVAL, "padding");
    b.n = 3;
    tu_assert_error(nb_random_crop(&b, 1) ? NULL : (void *)1, NB_EINVAL, "indices");
    nb_batch b2 = make_batch(nb_zeros_on(NB_CPU, (int64_t[]){4, 4}, 2, NB_F32), ids, 0, 0);
    tu_assert_error(nb_random_hflip(&b2, 0.5) ? NULL : (void *)1, NB_EDIM, "[4,4]");
    tu_assert_error(nb_random_hflip(NULL, 0.5) ? NULL : (void *)1, NB_ENULL, "batch");
    nb_image_aug bad = {.channels = 9};
    b = make_batch(x, ids, 0, 0);
    tu_assert_error(nb_image_aug_transform(&b, &bad) ? NULL : (void *)1, NB_EINVAL, "channels");
    nb_scope_end();
}
END_TEST

/* ---- text -------------------------------------------------------------------------------------- */
START_TEST(test_text) {
    nb_scope_begin();
    tmp_begin();
    char text[1000], p[512], pz[512];
    const char *src = "The quick brown fox jumps over the lazy dog. ";
    for (int i = 0; i < 1000; i++) text[i] = src[i % strlen(src)];
    write_file(tmp_path(p, "t.txt"), text, 1000, false);
    write_file(tmp_path(pz, "t.txt.gz"), text, 1000, true);
    nb_tensor *tok = nb_read_bytes(p);
    nb_tensor *tokz = nb_read_bytes(pz);
    ck_assert_msg(tok && tokz, "%s", nb_last_error());
    ck_assert(nb_tensor_dtype(tok) == NB_U8 && nb_numel(tok) == 1000 && nb_numel(tokz) == 1000);
    char *tv = raw_values(tok), *tzv = raw_values(tokz);
    ck_assert(memcmp(tv, text, 1000) == 0 && memcmp(tzv, text, 1000) == 0);
    free(tv);
    free(tzv);
    write_file(tmp_path(pz, "empty"), text, 0, false);
    nb_tensor *e = nb_read_bytes(pz);
    ck_assert(e && nb_numel(e) == 0);
    tu_assert_error(nb_read_bytes(tmp_path(pz, "missing")), NB_EIO, "missing");
    tu_assert_error(nb_read_bytes(NULL), NB_ENULL, "path");

    /* 90/10 split by position. */
    nb_tensor *tr, *va;
    ck_assert(nb_text_split(tok, 0.9, &tr, &va) == NB_OK);
    ck_assert(nb_numel(tr) == 900 && nb_numel(va) == 100);
    char *vv = raw_values(va);
    ck_assert(memcmp(vv, text + 900, 100) == 0);
    free(vv);
    tu_assert_error(nb_text_split(tok, 1.0, &tr, &va) ? NULL : (void *)1, NB_EINVAL, "(0, 1)");
    tu_assert_error(nb_text_split(nb_zeros((int64_t[]){2, 2}, 2, NB_U8), 0.5, &tr, &va)
                        ? NULL : (void *)1, NB_EDIM, "1-D");
    ck_assert(nb_text_split(tok, 0.9, &tr, &va) == NB_OK);

    /* Windows dataset: sample i is (tokens[i:i+8], tokens[i+1:i+9]). */
    nb_dataset *ds = nb_text_dataset_new(tr, 8);
    ck_assert_msg(ds != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_dataset_len(ds), 892);
    nb_loader_opts lo = nb_loader_defaults();
    lo.batch_size = 64, lo.shuffle = true, lo.seed = 1, lo.prefetch = 1, lo.world_size = 1;
    nb_loader *l = nb_loader_new(ds, &lo);
    int64_t seen = 0;
    for (nb_batch b; nb_loader_next(l, &b); ) {
        ck_assert(nb_ndim(b.x) == 2 && nb_shape(b.x)[1] == 8 && nb_tensor_dtype(b.y) == NB_I64);
        int64_t *x = raw_values(b.x), *y = raw_values(b.y);
        for (int64_t k = 0; k < b.n; k++)
            for (int t = 0; t < 8; t++) {
                ck_assert_int_eq(x[k * 8 + t], (unsigned char)text[b.indices[k] + t]);
                ck_assert_int_eq(y[k * 8 + t], (unsigned char)text[b.indices[k] + t + 1]);
            }
        free(x);
        free(y);
        seen += b.n;
    }
    ck_assert_int_eq(seen, 892);
    nb_loader_free(l);
    nb_dataset_free(ds);
    tu_assert_error(nb_text_dataset_new(va, 100), NB_EINVAL, "block size 100");
    tu_assert_error(nb_text_dataset_new(nb_zeros((int64_t[]){50}, 1, NB_F32), 8), NB_EDTYPE,
                    "f32");
    tu_assert_error(nb_text_dataset_new(NULL, 8), NB_ENULL, "tokens");

    /* Random windows from a generator, drawn as nb_randint would (into default-device x and
     * y). */
    for (int i32 = 0; i32 < 2; i32++) {
        nb_dtype dt = i32 ? NB_I32 : NB_I64;
        nb_generator *g1 = nb_generator_new(42), *g2 = nb_generator_new(42);
        nb_generator_set_offset(g1, 5);
        nb_generator_set_offset(g2, 5);
        nb_tensor *x = nb_empty((int64_t[]){6, 16}, 2, dt);
        nb_tensor *y = nb_empty((int64_t[]){6, 16}, 2, dt);
        for (int rep = 0; rep < 2; rep++) {
            ck_assert(nb_text_sample(tr, g1, x, y) == NB_OK);
            nb_tensor *starts = nb_randint((int64_t[]){6}, 1, NB_I64, 0, 900 - 16, g2);
            ck_assert_uint_eq(nb_generator_offset(g1), nb_generator_offset(g2));
            double *xv = tu_values(x), *yv = tu_values(y);
            int64_t *s = raw_values(starts);
            for (int b = 0; b < 6; b++)
                for (int t = 0; t < 16; t++) {
                    ck_assert(xv[b * 16 + t] == (unsigned char)text[s[b] + t]);
                    ck_assert(yv[b * 16 + t] == (unsigned char)text[s[b] + t + 1]);
                }
            free(s);
            free(xv);
            free(yv);
        }
        nb_generator_free(g1);
        nb_generator_free(g2);
    }
    nb_tensor *x = nb_empty((int64_t[]){2, 8}, 2, NB_I64);
    tu_assert_error(nb_text_sample(tr, NULL, x, nb_empty((int64_t[]){2, 9}, 2, NB_I64))
                        ? NULL : (void *)1, NB_ESHAPE, "(B, T)");
    tu_assert_error(nb_text_sample(tr, NULL, x, nb_empty((int64_t[]){2, 8}, 2, NB_I32))
                        ? NULL : (void *)1, NB_EDTYPE, "i64");
    tu_assert_error(nb_text_sample(nb_narrow(tr, 0, 0, 8), NULL, x, x) ? NULL : (void *)1,
                    NB_EINVAL, "more than 8 tokens");
    ck_assert(nb_text_sample(tr, NULL, x, nb_empty_like(x)) == NB_OK); /* default generator */
    tmp_end();
    nb_scope_end();
}
END_TEST

/* ---- other devices ------------------------------------------------------------------------
 * Data lives on the host: tensors of another device are copied to the host where that is
 * cheap (a dataset's samples, an IDX file's elements, text_sample's x and y); batch
 * transforms need host batches. Meta tensors have no data: NB_EDEVICE. The guard device
 * faults on any host access to its memory, so passing proves the copies go through the
 * backend. */

static bool same_host_values(nb_tensor *a, nb_tensor *b) {
    nb_tensor *ha = nb_contiguous(nb_to_device(a, NB_CPU));
    nb_tensor *hb = nb_contiguous(nb_to_device(b, NB_CPU));
    return ha && hb && nb_tensor_dtype(ha) == nb_tensor_dtype(hb) &&
           nb_numel(ha) == nb_numel(hb) &&
           memcmp(nb_data(ha), nb_data(hb),
                  (size_t)nb_numel(ha) * nb_dtype_size(nb_tensor_dtype(ha))) == 0;
}

START_TEST(test_data_other_devices) {
    nb_scope_begin();
    tmp_begin();
    char p[512], q[512];
    /* the CPU side of the comparisons is on the CPU whatever the default device */
    nb_tensor *x = on_host(tu_random((int64_t[]){10, 2, 3}, 3, NB_F32, -1, 1, 11));
    nb_tensor *y = on_host(tu_random((int64_t[]){10}, 1, NB_I64, 0, 9, 12));
    nb_tensor *gx = nb_to_device(x, GUARD), *gy = nb_to_device(y, GUARD);
    nb_tensor *mx = nb_empty_on(NB_META, (int64_t[]){10, 2, 3}, 3, NB_F32);

    /* IDX: a guard tensor (also a strided view of one) writes the CPU tensor's file. */
    ck_assert_msg(nb_idx_write(tmp_path(p, "c.idx"), x) == NB_OK, "%s", nb_last_error());
    ck_assert_msg(nb_idx_write(tmp_path(q, "g.idx"), gx) == NB_OK, "%s", nb_last_error());
    size_t np = 0, nq = 0;
    unsigned char *bp = slurp(p, &np), *bq = slurp(q, &nq);
    ck_assert(np == nq && memcmp(bp, bq, np) == 0);
    free(bp);
    free(bq);
    nb_tensor *xt = nb_transpose(x, 1, 2), *gxt = nb_transpose(gx, 1, 2);
    ck_assert(nb_idx_write(tmp_path(p, "ct.idx"), xt) == NB_OK);
    ck_assert(nb_idx_write(tmp_path(q, "gt.idx.gz"), gxt) == NB_OK);
    ck_assert(same_host_values(nb_idx_read(p), nb_idx_read(q)));
    tu_assert_error(nb_idx_write(tmp_path(p, "m.idx"), mx) == NB_OK ? (void *)1 : NULL,
                    NB_EDEVICE, "meta");
    ck_assert_int_eq(access(p, F_OK), -1); /* refused before creating the file */

    /* A dataset of guard tensors holds host copies: its batches are the CPU dataset's. */
    nb_dataset *dc = nb_tensor_dataset_new(x, y), *dg = nb_tensor_dataset_new(gx, gy);
    ck_assert_msg(dc && dg, "%s", nb_last_error());
    const int64_t idx[4] = {7, 0, 3, 3};
    const int64_t bsh[3] = {4, 2, 3};
    nb_tensor *bx1 = host_empty(bsh, 3, NB_F32), *by1 = host_empty(bsh, 1, NB_I64);
    nb_tensor *bx2 = host_empty(bsh, 3, NB_F32), *by2 = host_empty(bsh, 1, NB_I64);
    ck_assert(nb_dataset_get_batch(dc, idx, 4, bx1, by1) == NB_OK);
    ck_assert(nb_dataset_get_batch(dg, idx, 4, bx2, by2) == NB_OK);
    ck_assert(same_host_values(bx1, bx2) && same_host_values(by1, by2));
    /* Batches are written on the host: a guard batch tensor is refused, clearly. */
    nb_tensor *gb = nb_empty_on(GUARD, (int64_t[]){4, 2, 3}, 3, NB_F32);
    tu_assert_error(nb_dataset_get_batch(dc, idx, 4, gb, by1) == NB_OK ? (void *)1 : NULL,
                    NB_EDEVICE, "got a guard tensor");
    nb_dataset_free(dc);
    nb_dataset_free(dg);
    tu_assert_error(nb_tensor_dataset_new(mx, NULL), NB_EDEVICE, "meta");
    tu_assert_error(nb_tensor_dataset_new(x, nb_empty_on(NB_META, &(int64_t){10}, 1, NB_I64)),
                    NB_EDEVICE, "y cannot be copied to the host");

    /* Transforms run on host batches: a meta (or guard) batch is refused with NB_EDEVICE. */
    tu_assert_error(nb_normalize_(mx, (double[]){0.5}, (double[]){0.2}, 1) == NB_OK ? (void *)1
                                                                                  : NULL,
                    NB_EDEVICE, "normalize: needs a tensor in host memory, got a meta tensor");
    tu_assert_error(nb_normalize_(gx, (double[]){0.5}, (double[]){0.2}, 1) == NB_OK ? (void *)1
                                                                                  : NULL,
                    NB_EDEVICE, "guard");

    /* Text: a dataset over guard tokens; text_sample into guard (and meta) x and y draws
     * the same windows as into CPU ones and advances the generator the same. */
    char text[300];
    for (int i = 0; i < 300; i++) text[i] = (char)('a' + (i * 7) % 26);
    nb_tensor *tok = on_host(nb_from_buffer(text, &(int64_t){300}, 1, NB_U8));
    nb_tensor *gtok = nb_to_device(tok, GUARD);
    nb_dataset *tg = nb_text_dataset_new(gtok, 8);
    ck_assert_msg(tg != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_dataset_len(tg), 292);
    const int64_t wsh[2] = {4, 8};
    nb_tensor *wx = host_empty(wsh, 2, NB_I64), *wy = host_empty(wsh, 2, NB_I64);
    ck_assert(nb_dataset_get_batch(tg, idx, 4, wx, wy) == NB_OK);
    int64_t *wxd = raw_values(wx);
    for (int k = 0; k < 4; k++)
        for (int t = 0; t < 8; t++)
            ck_assert_int_eq(wxd[k * 8 + t], (unsigned char)text[idx[k] + t]);
    free(wxd);
    nb_dataset_free(tg);
    tu_assert_error(nb_text_dataset_new(nb_empty_on(NB_META, &(int64_t){300}, 1, NB_U8), 8),
                    NB_EDEVICE, "meta");
    for (int i32 = 0; i32 < 2; i32++) {
        nb_dtype dt = i32 ? NB_I32 : NB_I64;
        nb_generator *g1 = nb_generator_new(3), *g2 = nb_generator_new(3);
        nb_generator *g3 = nb_generator_new(3);
        const int64_t sh[2] = {5, 16};
        nb_tensor *cx = host_empty(sh, 2, dt), *cy = host_empty(sh, 2, dt);
        nb_tensor *dx = nb_empty_on(GUARD, sh, 2, dt), *dy = nb_empty_on(GUARD, sh, 2, dt);
        nb_tensor *ex = nb_empty_on(NB_META, sh, 2, dt), *ey = nb_empty_on(NB_META, sh, 2, dt);
        ck_assert(nb_text_sample(tok, g1, cx, cy) == NB_OK);
        ck_assert_msg(nb_text_sample(tok, g2, dx, dy) == NB_OK, "%s", nb_last_error());
        ck_assert_msg(nb_text_sample(tok, g3, ex, ey) == NB_OK, "%s", nb_last_error());
        ck_assert(same_host_values(cx, dx) && same_host_values(cy, dy));
        ck_assert_uint_eq(nb_generator_offset(g2), nb_generator_offset(g1));
        ck_assert_uint_eq(nb_generator_offset(g3), nb_generator_offset(g1));
        /* Tokens must be on the host (they are read for every sample). */
        tu_assert_error(nb_text_sample(gtok, g1, cx, cy) == NB_OK ? (void *)1 : NULL,
                        NB_EDEVICE, "text_sample: needs a tensor in host memory, got a guard");
        nb_generator_free(g1);
        nb_generator_free(g2);
        nb_generator_free(g3);
    }
    tmp_end();
    nb_scope_end();
}
END_TEST

void nb_tests_data_transforms(TCase *tc) {
    tcase_add_test(tc, test_transforms);
    tcase_add_test(tc, test_text);
    tcase_add_test(tc, test_data_other_devices);
}
