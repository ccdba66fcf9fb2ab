/* nabla/optim.h - optimizers (SGD, Adam, AdamW, RMSprop, Adagrad), parameter groups,
 * learning-rate schedules, gradient clipping, and optimizer state for checkpoints.
 *
 * Usage:
 *     nb_sgd_opts so = nb_sgd_defaults();            // then edit: every field is read as set
 *     so.lr = 0.05;
 *     so.momentum = 0.9;
 *     nb_optim *opt = nb_sgd_new(nb_parameters(model), &so);
 *     nb_sched_opts co = nb_sched_defaults(NB_SCHED_COSINE);
 *     co.warmup_steps = 100;
 *     co.total_steps = 5000;
 *     nb_sched *sched = nb_sched_new(opt, &co);
 *     for (...) {
 *         nb_scope_begin();
 *         nb_tensor *loss = nb_cross_entropy(nb_forward(model, x), y, NULL);
 *         nb_zero_grad(opt);
 *         nb_backward(loss);
 *         nb_clip_grad_norm(nb_optim_params(opt), 1.0, 2);   // optional; returns the norm
 *         nb_step(opt);
 *         nb_sched_step(sched);                               // lr for the next step
 *         nb_scope_end();
 *     }
 *     nb_sched_free(sched);
 *     nb_optim_free(opt);
 *
 * Weight decay on matrices only, as nanoGPT does:
 *     nb_params decay, no_decay;
 *     nb_params_split_decay(nb_parameters(model), &decay, &no_decay);
 *     nb_adamw_opts ao = nb_adamw_defaults();         // lr 1e-3, betas (0.9, 0.999), ...
 *     ao.lr = 6e-4;
 *     ao.betas[1] = 0.95;
 *     ao.weight_decay = 0.1;
 *     nb_optim *opt = nb_adamw_new(&decay, &ao);
 *     nb_group_opts go = nb_group_defaults();          // every field NAN: the optimizer's
 *     go.weight_decay = 0;                             // 0 is 0
 *     nb_optim_add_group(opt, &no_decay, &go);
 *     nb_params_deinit(&decay);
 *     nb_params_deinit(&no_decay);
 *
 * Semantics are PyTorch's (torch.optim, the single-tensor algorithms of 1.13): the same
 * defaults, the same update formulas (bias correction, eps outside the square root, SGD's
 * momentum buffer starting as the first gradient, ...), parameters without a gradient are
 * skipped. Each parameter is updated in one fused pass over parameter, gradient and state,
 * in place (parameters may be views into a flat buffer), with grad mode off.
 *
 * Dtypes: f32 and f64 parameters are updated in their dtype. f16 and bf16 parameters get
 * f32 master weights (docs/architecture.md rule 7, as Megatron and DeepSpeed): on its first
 * update the optimizer copies the parameter into an f32 master tensor it owns, keeps the
 * state in f32, runs the update on the master with the gradient converted to f32 (the
 * gradient may be of the parameter's dtype or already f32), and writes the master back
 * into the parameter rounded to nearest even. The master is saved with the state
 * ("master.<param name>"). Load model weights before the optimizer's state: a master copy
 * made from the parameter is not remade when the parameter is later overwritten.
 *
 * Devices: a parameter is updated on its own device, where its gradient must be too; its
 * state is created there. Parameters of one optimizer may be on different devices. Move
 * the model (nb_module_to) before creating the optimizer, as in PyTorch: state made before
 * a move stays on the old device and the next nb_step fails with NB_EDEVICE (loading the
 * state again moves it). On the meta device a step checks everything, creates meta state
 * and advances step counts without computing anything.
 *
 * Options (docs/conventions.md): each options struct has a constructor of its defaults
 * (nb_adam_defaults(), ...; PyTorch's values, listed with each struct) that you then edit;
 * NULL options mean those defaults; a struct that did not start from them (a compound literal
 * such as &(nb_adam_opts){.lr = 1e-3}, a zeroed struct) is refused with NB_EINVAL and a
 * message showing the idiom. Every field is read as written: 0 is 0 (AdamW with
 * .weight_decay = 0 has no weight decay, .betas = {0, 0.99} has beta1 = 0), and a value out
 * of range is an error, never replaced by a default.
 *
 * Ownership: an optimizer retains its parameters (they stay alive while it lives) and
 * owns its state; the nb_params passed in are copied, so they may be freed after the call.
 * nb_optim_params / nb_optim_state return lists owned by the optimizer (see each). A
 * schedule borrows its optimizer, which must outlive it. nb_params_split_decay fills
 * caller-owned lists released with nb_params_deinit (the tensors and names in them are
 * borrowed from the input list).
 *
 * Threads: an optimizer is used by one thread at a time; the update itself runs on the
 * OpenMP pool for large parameters, with results independent of the thread count. */
#ifndef NABLA_OPTIM_H
#define NABLA_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "nabla/nn.h"
#include "nabla/status.h"
#include "nabla/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_optim nb_optim;

/* ---- optimizers ------------------------------------------------------------------------------ */
/* SGD: lr is required (> 0; PyTorch has no default either: nb_sgd_defaults() leaves it 0,
 * which nb_sgd_new rejects). momentum, dampening and weight_decay default to 0. nesterov
 * needs momentum > 0 and dampening 0. */
typedef struct nb_sgd_opts {
    uint32_t _init; /* private: set by nb_sgd_defaults() only */
    double lr;
    double momentum;
    double dampening;
    double weight_decay;   /* L2 penalty added to the gradient */
    bool nesterov;
    bool maximize;         /* ascend instead of descend */
} nb_sgd_opts;
nb_sgd_opts nb_sgd_defaults(void);

/* Adam / AdamW defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8 (added outside the square
 * root), weight_decay 0 (Adam: added to the gradient) or 1e-2 (AdamW: decoupled,
 * p *= 1 - lr*wd), amsgrad and maximize off. amsgrad keeps the running maximum of the
 * second moment. */
typedef struct nb_adam_opts {
    uint32_t _init; /* private: set by nb_adam[w]_defaults() only */
    double lr;
    double betas[2];
    double eps;
    double weight_decay;
    bool amsgrad;
    bool maximize;
} nb_adam_opts;
typedef nb_adam_opts nb_adamw_opts;
nb_adam_opts nb_adam_defaults(void);
nb_adamw_opts nb_adamw_defaults(void);   /* the same but weight_decay 1e-2 */

/* RMSprop defaults: lr 1e-2, alpha 0.99, eps 1e-8, weight_decay 0, momentum 0; centered divides by
 * the estimated variance (square average minus squared gradient average). */
typedef struct nb_rmsprop_opts {
    uint32_t _init; /* private: set by nb_rmsprop_defaults() only */
    double lr;
    double alpha;
    double eps;
    double weight_decay;
    double momentum;
    bool centered;
    bool maximize;
} nb_rmsprop_opts;
nb_rmsprop_opts nb_rmsprop_defaults(void);

/* Adagrad defaults: lr 1e-2, lr_decay 0 (lr / (1 + (step - 1) * lr_decay)), weight_decay 0,
 * initial_accumulator_value 0, eps 1e-10. */
typedef struct nb_adagrad_opts {
    uint32_t _init; /* private: set by nb_adagrad_defaults() only */
    double lr;
    double lr_decay;
    double weight_decay;
    double initial_accumulator_value;
    double eps;
    bool maximize;
} nb_adagrad_opts;
nb_adagrad_opts nb_adagrad_defaults(void);

/* Make an optimizer over params (its first parameter group; an empty list is allowed when
 * groups follow). o may be NULL for the defaults (not for SGD, which needs lr). Parameters
 * must be float (f32/f64, or f16/bf16 with f32 master weights), contiguous, CPU, and listed
 * once. Returns a new optimizer the caller frees with nb_optim_free, or NULL (NB_EINVAL for a bad hyperparameter, with
 * PyTorch's rule in the message, e.g. "sgd: lr must be > 0"). State names use the
 * parameters' names (params->names; the index as a decimal string where names is NULL). */
nb_optim *nb_sgd_new(const nb_params *params, const nb_sgd_opts *o);
nb_optim *nb_adam_new(const nb_params *params, const nb_adam_opts *o);
nb_optim *nb_adamw_new(const nb_params *params, const nb_adamw_opts *o);
nb_optim *nb_rmsprop_new(const nb_params *params, const nb_rmsprop_opts *o);
nb_optim *nb_adagrad_new(const nb_params *params, const nb_adagrad_opts *o);
/* Releases the state and the references to the parameters. NULL is a no-op. */
void nb_optim_free(nb_optim *opt);
/* "sgd", "adam", "adamw", "rmsprop", "adagrad". */
const char *nb_optim_name(const nb_optim *opt);

/* ---- parameter groups ------------------------------------------------------------------------ */
/* Hyperparameters of a group. A field that is NAN takes the optimizer's value (what its
 * constructor was given), as PyTorch's per-group dicts fall back to the defaults; any other
 * value is the group's, 0 included. nb_group_defaults() sets every field to NAN; edit the
 * ones the group changes. A field the optimizer does not have (betas for SGD) must be NAN
 * or 0. Flags (nesterov, amsgrad, centered, maximize) are per optimizer. */
typedef struct nb_group_opts {
    uint32_t _init; /* private: set by nb_group_defaults() only */
    double lr;
    double weight_decay;
    double momentum;                   /* sgd, rmsprop */
    double dampening;                  /* sgd */
    double betas[2];                   /* adam, adamw */
    double eps;                        /* adam, adamw, rmsprop, adagrad */
    double alpha;                      /* rmsprop */
    double lr_decay;                   /* adagrad */
    double initial_accumulator_value;  /* adagrad */
} nb_group_opts;
nb_group_opts nb_group_defaults(void);

/* Add a group of parameters with its own hyperparameters (o NULL: the optimizer's). A
 * parameter may belong to one group only. Returns the group's index (the first group is
 * 0), or a negative status. */
int nb_optim_add_group(nb_optim *opt, const nb_params *params, const nb_group_opts *o);
int nb_optim_num_groups(const nb_optim *opt);
/* The group's hyperparameters (NAN in the fields the optimizer does not have), so that
 * nb_optim_add_group(opt, params, out) makes a group with the same ones. */
nb_status nb_optim_group_opts(const nb_optim *opt, int group, nb_group_opts *out);
/* Learning rate of a group; NAN (and an error) for a bad group. */
double nb_optim_get_lr(const nb_optim *opt, int group);
/* Set a group's learning rate (>= 0); group -1 sets every group. Schedules use this. */
nb_status nb_optim_set_lr(nb_optim *opt, int group, double lr);
/* All parameters, group by group, with their names. Owned by the optimizer; valid until
 * the next nb_optim_add_group or nb_optim_free. */
const nb_params *nb_optim_params(const nb_optim *opt);

/* Split params by rank into those that get weight decay (2-D and up: matmul and embedding
 * weights) and those that do not (biases, norm weights: 0-D and 1-D), keeping the order.
 * decay and no_decay are caller-owned structs, released with nb_params_deinit. */
nb_status nb_params_split_decay(const nb_params *params, nb_params *decay, nb_params *no_decay);
/* Free the arrays of a list filled by nb_params_split_decay (not the tensors or names). */
void nb_params_deinit(nb_params *p);

/* ---- the training step ----------------------------------------------------------------------- */
/* Drop every parameter's gradient (PyTorch's set_to_none=True), except gradients that share
 * their storage with other tensors (views into a flat gradient buffer installed by
 * nb_set_grad / nb_module_flatten_parameters): those are zeroed in place, so the flat
 * layout survives. */
nb_status nb_zero_grad(nb_optim *opt);
/* Update every parameter that has a gradient, in place. State is allocated on a
 * parameter's first update. Checks every parameter before changing any, so an error
 * (gradient dtype differs, parameter on another device, ...) leaves the model unchanged. */
nb_status nb_step(nb_optim *opt);

/* ---- loss scaling (fp16) --------------------------------------------------------------------- */
/* A dynamic loss scaler with PyTorch's GradScaler semantics, for f16 training where small
 * gradients would underflow to zero:
 *     nb_grad_scaler *gs = nb_grad_scaler_new(NULL);    // scale 2^16, x2 every 2000 steps
 *     for (...) {
 *         nb_scope_begin();
 *         nb_tensor *loss = nb_cross_entropy(nb_forward(model, x), y, NULL);
 *         nb_zero_grad(opt);
 *         nb_backward(nb_grad_scaler_scale(gs, loss));   // loss * scale
 *         nb_grad_scaler_unscale(gs, opt);               // optional: before clipping
 *         nb_clip_grad_norm(nb_optim_params(opt), 1.0, 2);
 *         nb_grad_scaler_step(gs, opt);                  // nb_step unless inf/NaN
 *         if (nb_grad_scaler_update(gs) != NB_OK) ...    // the scale underflowed: stop
 *         nb_scope_end();
 *     }
 *     nb_grad_scaler_free(gs);
 * unscale multiplies every gradient of the optimizer's parameters by 1 / scale and checks
 * them for inf/NaN in the same pass (the amp_unscale kernel). f32/f64 gradients are unscaled
 * in place; an f16/bf16 gradient is unscaled into an f32 buffer the scaler keeps, which
 * replaces it as the parameter's gradient until the step, so that small gradients do not
 * underflow again (the optimizer's master weights take f32 gradients); step puts the
 * original gradient tensors back (flat gradient buffers keep their layout). step skips
 * nb_step when a gradient was inf or NaN; update then multiplies the scale by
 * backoff_factor and restarts the count of clean steps; after growth_interval clean steps
 * in a row it multiplies the scale by growth_factor. With a communicator
 * (nb_grad_scaler_set_comm, nabla/parallel.h) the inf/NaN flag is one allreduce (max)
 * across the ranks, so every rank skips the same steps (required under nb_zero, where each
 * rank holds its shard's gradients, which unscale then works on). A scaler serves one optimizer at a time (the one given to
 * unscale/step since the last update). Ownership: the caller frees the scaler; it borrows
 * the optimizer during a call only. */
typedef struct nb_grad_scaler_opts {
    uint32_t _init;           /* private: set by nb_grad_scaler_defaults() only */
    double init_scale;        /* 65536 (2^16) */
    double growth_factor;     /* 2 (> 1) */
    double backoff_factor;    /* 0.5 (in (0, 1)) */
    int64_t growth_interval;  /* 2000 (>= 1) clean steps in a row before the scale grows */
    double min_scale;         /* 1: update fails (NB_ESTATE, naming the step) when the scale
                               * falls below it: the gradients are inf/NaN whatever the
                               * scale; 0: never */
    bool enabled;             /* true; false: scale returns the loss, unscale does nothing,
                               * step is nb_step, update only counts (f32 runs) */
} nb_grad_scaler_opts;
nb_grad_scaler_opts nb_grad_scaler_defaults(void);

typedef struct nb_grad_scaler nb_grad_scaler;
/* A new scaler (o NULL: the defaults) the caller frees, or NULL (NB_EINVAL for a bad
 * option, e.g. "grad_scaler: growth_factor must be > 1, got 1"). */
nb_grad_scaler *nb_grad_scaler_new(const nb_grad_scaler_opts *o);
void nb_grad_scaler_free(nb_grad_scaler *s);  /* NULL is a no-op */
/* loss * scale (a new tensor in the innermost scope, recorded for autograd, in loss's
 * dtype); the loss itself (one more reference, in the innermost scope) when disabled. */
nb_tensor *nb_grad_scaler_scale(nb_grad_scaler *s, nb_tensor *loss);
/* Unscale opt's gradients and check them for inf/NaN (see above). Once per step: a second
 * call before nb_grad_scaler_update is NB_ESTATE, as PyTorch's unscale_. */
nb_status nb_grad_scaler_unscale(nb_grad_scaler *s, nb_optim *opt);
/* Unscale (unless done since the last update), then nb_step(opt) unless a gradient was
 * inf or NaN (then the step is skipped and opt is unchanged). Returns nb_step's status, or
 * NB_OK for a skipped step; nb_grad_scaler_skipped says which. */
nb_status nb_grad_scaler_step(nb_grad_scaler *s, nb_optim *opt);
/* Adjust the scale for the next step (see above); call once per step, after step.
 * NB_ESTATE when the scale fell below min_scale: "grad_scaler_update: the loss scale fell
 * to 0.5 (below min_scale 1) at step 123 ...". */
nb_status nb_grad_scaler_update(nb_grad_scaler *s);
/* nb_grad_scaler_step then nb_grad_scaler_update: the one call a training loop makes after
 * nb_backward(nb_grad_scaler_scale(s, loss)) (and clipping, after nb_grad_scaler_unscale).
 * With a disabled scaler it is nb_step. Returns the first failure: nb_step's, or update's
 * NB_ESTATE when the scale underflowed (the message names the step). */
nb_status nb_grad_scaler_step_update(nb_grad_scaler *s, nb_optim *opt);
double nb_grad_scaler_get_scale(const nb_grad_scaler *s);   /* NAN for NULL */
/* Whether the last nb_grad_scaler_step skipped the update (inf/NaN gradients). */
bool nb_grad_scaler_skipped(const nb_grad_scaler *s);
/* Steps so far (nb_grad_scaler_update calls) and how many of them were skipped. */
int64_t nb_grad_scaler_num_steps(const nb_grad_scaler *s);
int64_t nb_grad_scaler_num_skipped(const nb_grad_scaler *s);
/* The state as named 0-dim tensors: "scale" (f64), "growth_tracker" (i64: clean steps in a
 * row), "steps" and "skipped" (i64). Owned by the scaler, valid until the next call to
 * nb_grad_scaler_state or nb_grad_scaler_free. nb_checkpoint saves it as "scaler.<name>". */
const nb_params *nb_grad_scaler_state(nb_grad_scaler *s);
/* Restore that state (all four entries, checked first; on error nothing changes). */
nb_status nb_grad_scaler_load_state(nb_grad_scaler *s, const char *const *names,
                                    nb_tensor *const *tensors, int n);

/* ---- state (checkpoints) --------------------------------------------------------------------- */
/* The optimizer's state as named tensors, enough to continue bit-exactly:
 *   "<slot>.<param name>" for each state tensor of a parameter that has state: sgd
 *       "momentum_buffer"; adam/adamw "exp_avg", "exp_avg_sq", "max_exp_avg_sq" (amsgrad);
 *       rmsprop "square_avg", "momentum_buffer" (momentum > 0), "grad_avg" (centered);
 *       adagrad "sum" — same shape as the parameter, same dtype (f32 for an f16/bf16
 *       parameter);
 *   "master.<param name>": the f32 master copy of an f16/bf16 parameter (absent when
 *       loading: made from the parameter);
 *   "step.<param name>" (not sgd): the parameter's update count, a 0-dim i64 tensor;
 *   "param_groups.<g>.<hyperparameter>": each group's numeric hyperparameters as 0-dim f64
 *       tensors ("lr", "weight_decay", "momentum", "dampening", "beta1", "beta2", "eps",
 *       "alpha", "lr_decay", "initial_accumulator_value": those the optimizer has).
 * Parameters that were never updated have no entries. The list and its tensors are owned by
 * the optimizer: the state tensors are the live ones (read them, do not write), the scalar
 * ones are snapshots; valid until the next call to nb_optim_state, nb_step,
 * nb_optim_load_state, nb_optim_add_group or nb_optim_free. */
const nb_params *nb_optim_state(nb_optim *opt);
/* Free the snapshot nb_optim_state made (its scalar tensors) now instead of at the next
 * call; the list it returned becomes invalid. For savers that are done with it. */
void nb_optim_state_release(nb_optim *opt);
/* Replace the optimizer's state by n named tensors in the form nb_optim_state gives (same
 * optimizer kind and flags, same parameter names and groups). Everything is checked first
 * (NB_EINVAL for a missing or unexpected name, NB_ESHAPE / NB_EDTYPE for a mis-shaped or
 * mistyped tensor); on error nothing changes. The tensors are copied (the caller keeps
 * them) to each parameter's device, so state saved from one device loads on another;
 * scalars are read from any device. Meta tensors have no values to load (NB_EDEVICE),
 * unless the parameters are meta too. Parameters without entries get fresh state, as if
 * never updated. */
nb_status nb_optim_load_state(nb_optim *opt, const char *const *names, nb_tensor *const *tensors,
                              int n);

/* ---- gradient clipping ----------------------------------------------------------------------- */
/* Total norm of the gradients of params (as if concatenated), norm_type any p > 0 (2: the
 * Euclidean norm; 0 is an error, not a default) or INFINITY (max |g|); accumulated in f64 in a fixed order (independent of threads).
 * Then, if max_norm / (norm + 1e-6) < 1, every gradient is scaled by it in place (as
 * torch.nn.utils.clip_grad_norm_). Parameters without gradients are skipped. Returns the
 * norm before clipping (inf or nan when a gradient is), or a negative status on error.
 * max_norm = INFINITY just measures. Each gradient is read and scaled on its own device;
 * meta gradients have no values, so with one the norm is NAN (not an error) and nothing is
 * scaled. Parallel models (parameters with placements, nabla/mesh.h: tensor-parallel slices,
 * pipeline stages and tied copies, ZeRO shards): the norm is the whole model's, the same on
 * every rank (each distinct part counted once, one allreduce over the placements' mesh), and
 * every rank scales its own part; the call is then collective over that mesh. */
double nb_clip_grad_norm(const nb_params *params, double max_norm, double norm_type);
/* Clamp every gradient element to [-clip, clip] in place (clip >= 0). */
nb_status nb_clip_grad_value(const nb_params *params, double clip);

/* ---- learning-rate schedules ----------------------------------------------------------------- */
/* Each schedule gives lr(t) from a group's base lr (its lr when the schedule was made),
 * for t = 0, 1, 2, ... the number of nb_sched_step calls so far:
 *   CONSTANT     base
 *   STEP         base * gamma^floor(t / step_size)                     (StepLR)
 *   MULTISTEP    base * gamma^(number of milestones <= t)              (MultiStepLR)
 *   EXPONENTIAL  base * gamma^t                                        (ExponentialLR)
 *   COSINE       linear warmup base * (t + 1) / warmup_steps for t < warmup_steps, then
 *                min_lr + (base - min_lr) * (1 + cos(pi * (t - w) / (total - w))) / 2,
 *                min_lr from total_steps on (LinearLR(1/w) then CosineAnnealingLR(eta_min))
 *   LINEAR       the same warmup, then min_lr + (base - min_lr) * (total - t) / (total - w),
 *                min_lr from total_steps on (HF's linear schedule with warmup)
 *   ONECYCLE     PyTorch's OneCycleLR (cos annealing, two phases): from max_lr / div_factor
 *                up to max_lr over pct_start * total_steps steps, then down to
 *                max_lr / div_factor / final_div_factor at total_steps - 1; base = max_lr
 *                (the group's lr when max_lr is NAN). Stepping past total_steps is an error.
 *                cycle_momentum (off by default, unlike PyTorch) also anneals momentum
 *                (beta1 for Adam) between max_momentum and base_momentum inversely.
 * The closed forms equal PyTorch's chained (multiplicative) forms up to rounding. */
typedef enum nb_sched_kind {
    NB_SCHED_CONSTANT = 0,
    NB_SCHED_STEP,
    NB_SCHED_MULTISTEP,
    NB_SCHED_EXPONENTIAL,
    NB_SCHED_COSINE,
    NB_SCHED_LINEAR,
    NB_SCHED_ONECYCLE,
} nb_sched_kind;

/* Options; make them with nb_sched_defaults(kind), which gives the values after each field
 * ("required": left at 0, which is rejected, so set it). Every field is read as written. */
typedef struct nb_sched_opts {
    uint32_t _init; /* private: set by nb_sched_defaults(kind) only */
    nb_sched_kind kind;
    double gamma;               /* step, multistep: 0.1; exponential: required */
    int64_t step_size;          /* step: required */
    const int64_t *milestones;  /* multistep: increasing step counts (copied); NULL */
    int num_milestones;         /* 0 */
    int64_t warmup_steps;       /* cosine, linear: 0 (none) */
    int64_t total_steps;        /* cosine, linear, onecycle: required */
    double min_lr;              /* cosine, linear: the final lr; 0 */
    double max_lr;              /* onecycle: NAN (each group's lr) */
    double pct_start;           /* onecycle: 0.3 */
    double div_factor;          /* onecycle: 25 */
    double final_div_factor;    /* onecycle: 1e4 */
    bool cycle_momentum;        /* onecycle: false */
    double base_momentum;       /* 0.85 */
    double max_momentum;        /* 0.95 */
} nb_sched_opts;
nb_sched_opts nb_sched_defaults(nb_sched_kind kind);

typedef struct nb_sched nb_sched;

/* Make a schedule for opt's groups (add groups first) and set every group's lr to lr(0).
 * Returns a new schedule the caller frees with nb_sched_free (before the optimizer), or
 * NULL with NB_EINVAL for bad options. */
nb_sched *nb_sched_new(nb_optim *opt, const nb_sched_opts *o);
void nb_sched_free(nb_sched *s);
/* Advance to the next step and set every group's lr (and momentum, see ONECYCLE). */
nb_status nb_sched_step(nb_sched *s);
/* Jump to step t (>= 0) and set the lrs, e.g. when resuming. */
nb_status nb_sched_set_step(nb_sched *s, int64_t t);
/* The number of nb_sched_step calls so far (PyTorch's last_epoch). */
int64_t nb_sched_last_step(const nb_sched *s);
/* The pure schedule: lr at step t for a group whose base lr is base_lr; NAN (and an error)
 * for bad options or t out of range. */
double nb_sched_lr_at(const nb_sched_opts *o, double base_lr, int64_t t);
/* Momentum at step t when o->cycle_momentum (ONECYCLE); NAN otherwise. */
double nb_sched_momentum_at(const nb_sched_opts *o, int64_t t);
/* State as named tensors: "last_step" (0-dim i64) and "base_lrs" (f64, one per group).
 * Owned by the schedule, valid until the next nb_sched_state call or nb_sched_free. */
const nb_params *nb_sched_state(nb_sched *s);
/* Free the snapshot nb_sched_state made; the list it returned becomes invalid. */
void nb_sched_state_release(nb_sched *s);
/* Restore that state (checked: names, shapes, group count) and set the lrs for it. */
nb_status nb_sched_load_state(nb_sched *s, const char *const *names, nb_tensor *const *tensors,
                              int n);

#ifdef __cplusplus
}
#endif
#endif
